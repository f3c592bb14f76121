#include "transport/link_pacer.hpp"

namespace dualpath::transport {

namespace {

__extension__ typedef unsigned __int128 u128;

} // namespace

link_pacer::link_pacer(uint64_t bytes_per_second) : rate_(bytes_per_second) {
  // nop
}

link_pacer::time_point link_pacer::reserve(uint64_t bytes, time_point now) {
  std::lock_guard<std::mutex> guard{mtx_};
  reserved_ += bytes;
  if (rate_ == 0)
    return now;
  auto start = now > next_free_ ? now : next_free_;
  // Nanoseconds = bytes * 1e9 / rate, computed in 128 bits (a 16 GiB
  // reservation times 1e9 overflows 64 bits) with the remainder carried to
  // the next reservation so that many small transfers add up exactly.
  u128 num = static_cast<u128>(bytes) * 1000000000u + carry_;
  auto ns = static_cast<uint64_t>(num / rate_);
  carry_ = static_cast<uint64_t>(num % rate_);
  next_free_ = start + std::chrono::nanoseconds{ns};
  return next_free_;
}

link_pacer::time_point link_pacer::busy_until() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return next_free_;
}

void link_pacer::set_rate(uint64_t bytes_per_second) {
  std::lock_guard<std::mutex> guard{mtx_};
  rate_ = bytes_per_second;
  carry_ = 0;
}

uint64_t link_pacer::reserved_bytes() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return reserved_;
}

} // namespace dualpath::transport
