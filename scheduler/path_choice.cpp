#include "scheduler/path_choice.hpp"

#include <algorithm>
#include <cmath>

#include "config/enum_names.hpp"

namespace dualpath::scheduler {

constexpr std::string_view read_mode_names[] = {"pe_only", "shorter_queue",
                                                "split"};

std::string to_string(read_mode x) {
  return config::name_of(x, read_mode_names, "read_mode");
}

read_split choose_path(uint64_t pe_read_q, uint64_t de_read_q,
                       uint32_t hit_blocks) {
  return read_split{hit_blocks, pe_read_q <= de_read_q ? hit_blocks : 0u};
}

read_split split_reads(uint64_t pe_read_q, double pe_rate, uint64_t de_read_q,
                       double de_rate, uint32_t hit_blocks,
                       uint32_t block_tokens) {
  if (hit_blocks == 0 || block_tokens == 0)
    return choose_path(pe_read_q, de_read_q, hit_blocks);
  const double h = hit_blocks;
  const double t = block_tokens;
  const double qp = static_cast<double>(pe_read_q);
  const double qd = static_cast<double>(de_read_q);
  auto makespan = [&](double k) {
    return std::max((qp + k * t) / pe_rate, (qd + (h - k) * t) / de_rate);
  };
  double k_star =
      (pe_rate * (qd + h * t) - de_rate * qp) / (t * (pe_rate + de_rate));
  double lo = std::clamp(std::floor(k_star), 0.0, h);
  double hi = std::clamp(std::ceil(k_star), 0.0, h);
  double k = makespan(hi) <= makespan(lo) ? hi : lo;
  return read_split{hit_blocks, static_cast<uint32_t>(k)};
}

read_split plan_reads(read_mode mode, uint64_t pe_read_q, double pe_rate,
                      uint64_t de_read_q, double de_rate, uint32_t hit_blocks,
                      uint32_t block_tokens) {
  switch (mode) {
    case read_mode::pe_only:
      return read_split{hit_blocks, hit_blocks};
    case read_mode::shorter_queue:
      return choose_path(pe_read_q, de_read_q, hit_blocks);
    case read_mode::split:
      return split_reads(pe_read_q, pe_rate, de_read_q, de_rate, hit_blocks,
                         block_tokens);
  }
  return read_split{hit_blocks, hit_blocks};
}

} // namespace dualpath::scheduler
