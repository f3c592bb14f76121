#include "actors/cluster/report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace dualpath::actors::cluster {

double quantile(std::vector<double> xs, double p) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto rank =
      static_cast<size_t>(std::ceil(p * static_cast<double>(xs.size())));
  rank = std::clamp<size_t>(rank, 1, xs.size());
  return xs[rank - 1];
}

mode_report summarize(const std::string& mode, const replay_outcome& outcome,
                      const std::vector<snic_usage>& snics, const slo& goal) {
  mode_report r;
  r.mode = mode;
  r.jct_s = static_cast<double>(outcome.jct_ns) / 1e9;
  std::vector<double> agents_done;
  for (auto t : outcome.agent_done_ns)
    agents_done.push_back(static_cast<double>(t) / 1e9);
  r.agents_done_p50_s = quantile(agents_done, 0.5);
  r.agents_done_p90_s = quantile(agents_done, 0.9);
  r.wall_s = outcome.wall_s;
  r.lag_p99_ms = outcome.lag_p99_ms;
  std::vector<double> ttft;
  std::vector<double> ttst;
  std::vector<double> tpot;
  std::vector<double> control_rtt;
  uint64_t tokens = 0;
  uint64_t met = 0;
  for (auto& rec : outcome.records) {
    ++r.requests;
    if (rec.failed) {
      if (r.failed_requests++ == 0)
        r.first_error = rec.error;
      continue;
    }
    auto& x = rec.result;
    tokens += rec.prompt_tokens + rec.gen_tokens;
    auto ft = static_cast<double>(x.ttft_ns) / 1e9;
    auto st = static_cast<double>(x.ttst_ns) / 1e9;
    auto pt = static_cast<double>(x.tpot_ns) / 1e9;
    ttft.push_back(ft);
    ttst.push_back(st);
    tpot.push_back(pt);
    if (ft <= goal.ttft_s && pt <= goal.tpot_s)
      ++met;
    r.bytes_read_pe_side += x.bytes_read_pe;
    r.bytes_read_de_side += x.bytes_read_de;
    r.bytes_compute_net += x.bytes_compute_net;
    r.blocks_verified += x.blocks_verified;
    r.verify_failures += x.verify_failures;
    r.recomputed_blocks += x.recomputed_blocks;
    r.blocks_persisted += x.blocks_persisted;
    r.reroutes += x.reroutes;
    r.buffer_waits += x.buffer_waits;
    if (x.control_rtt_ns >= 0)
      control_rtt.push_back(static_cast<double>(x.control_rtt_ns) / 1e6);
  }
  r.control_rtt_p50_ms = quantile(control_rtt, 0.5);
  r.control_rtt_p99_ms = quantile(control_rtt, 0.99);
  r.tokens_per_s = r.jct_s > 0 ? static_cast<double>(tokens) / r.jct_s : 0;
  r.ttft_p50_s = quantile(ttft, 0.5);
  r.ttft_p99_s = quantile(ttft, 0.99);
  r.ttst_p50_s = quantile(ttst, 0.5);
  r.ttst_p99_s = quantile(ttst, 0.99);
  r.tpot_p50_s = quantile(tpot, 0.5);
  r.tpot_p99_s = quantile(tpot, 0.99);
  r.slo_attainment = ttft.empty() ? 0
                                  : static_cast<double>(met)
                                        / static_cast<double>(ttft.size());
  // Utilisation = bytes / (rate x JCT); Max/Avg over every storage NIC.
  double sum_pe = 0;
  double sum_de = 0;
  size_t n_pe = 0;
  size_t n_de = 0;
  double max_util = 0;
  double sum_util = 0;
  for (auto& s : snics) {
    double cap = static_cast<double>(s.rate_bytes_per_s) * r.jct_s;
    double u = cap > 0 ? static_cast<double>(s.bytes) / cap : 0;
    if (s.role == engine_role::prefill) {
      sum_pe += u;
      ++n_pe;
    } else {
      sum_de += u;
      ++n_de;
    }
    max_util = std::max(max_util, u);
    sum_util += u;
  }
  r.snic_util_pe = n_pe > 0 ? sum_pe / static_cast<double>(n_pe) : 0;
  r.snic_util_de = n_de > 0 ? sum_de / static_cast<double>(n_de) : 0;
  auto avg = snics.empty() ? 0 : sum_util / static_cast<double>(snics.size());
  r.snic_max_over_avg = avg > 0 ? max_util / avg : 0;
  return r;
}

nlohmann::json to_json(const mode_report& r) {
  return nlohmann::json{
      {"requests", r.requests},
      {"failed_requests", r.failed_requests},
      {"first_error", r.first_error.empty() ? nlohmann::json(nullptr)
                                            : nlohmann::json(r.first_error)},
      {"jct_s", r.jct_s},
      {"agents_done_p50_s", r.agents_done_p50_s},
      {"agents_done_p90_s", r.agents_done_p90_s},
      {"bound", r.bound.name},
      {"bound_s", r.bound.s},
      {"jct_over_bound", r.jct_over_bound},
      {"tokens_per_s", r.tokens_per_s},
      {"ttft_p50_s", r.ttft_p50_s},
      {"ttft_p99_s", r.ttft_p99_s},
      {"ttst_p50_s", r.ttst_p50_s},
      {"ttst_p99_s", r.ttst_p99_s},
      {"tpot_p50_s", r.tpot_p50_s},
      {"tpot_p99_s", r.tpot_p99_s},
      {"slo_attainment", r.slo_attainment},
      {"snic_util_pe", r.snic_util_pe},
      {"snic_util_de", r.snic_util_de},
      {"snic_max_over_avg", r.snic_max_over_avg},
      {"bytes_read_pe_side", r.bytes_read_pe_side},
      {"bytes_read_de_side", r.bytes_read_de_side},
      {"bytes_compute_net", r.bytes_compute_net},
      {"blocks_verified", r.blocks_verified},
      {"verify_failures", r.verify_failures},
      {"recomputed_blocks", r.recomputed_blocks},
      {"blocks_persisted", r.blocks_persisted},
      {"reroutes", r.reroutes},
      {"buffer_waits", r.buffer_waits},
      {"wall_s", r.wall_s},
      {"setup_s", r.setup_s},
      {"lag_p99_ms", r.lag_p99_ms},
      {"control_rtt_p50_ms", r.control_rtt_p50_ms},
      {"control_rtt_p99_ms", r.control_rtt_p99_ms},
  };
}

void set_bound(mode_report& r, mode_bound b) {
  r.jct_over_bound = b.s > 0 ? r.jct_s / b.s : 0;
  r.bound = std::move(b);
}

nlohmann::json to_json(const fluid_bounds& b) {
  return nlohmann::json{
      {"prefill_compute_s", b.prefill_compute_s},
      {"pe_snic_s", b.pe_snic_s},
      {"all_snic_s", b.all_snic_s},
      {"prefill_flops", b.prefill_flops},
      {"hit_tokens", b.hit_tokens},
      {"hit_bytes", b.hit_bytes},
      {"pe_flops_per_s", b.pe_flops_per_s},
      {"pe_snic_bytes_per_s", b.pe_snic_bytes_per_s},
      {"all_snic_bytes_per_s", b.all_snic_bytes_per_s},
  };
}

namespace {

std::string fixed(double x, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}

std::string bytes_text(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double x = static_cast<double>(b);
  int u = 0;
  while (x >= 1000 && u < 5) {
    x /= 1000;
    ++u;
  }
  return fixed(x, u == 0 ? 0 : 2) + " " + units[u];
}

// A mode_bound's name as the table prints it.
std::string bound_label(const std::string& name) {
  if (name == "prefill_compute")
    return "(compute)";
  if (name == "pe_snic")
    return "(PE SNIC)";
  if (name == "all_snic")
    return "(all SNIC)";
  return "";
}

} // namespace

void print_table(std::ostream& out, const std::vector<mode_report>& modes,
                 reroute_row reroutes) {
  using row_fn = std::string (*)(const mode_report&);
  struct row {
    const char* name;
    row_fn fn;
  };
  static const row rows[] = {
      {"requests",
       [](const mode_report& r) { return std::to_string(r.requests); }},
      {"failed",
       [](const mode_report& r) { return std::to_string(r.failed_requests); }},
      {"JCT (s)", [](const mode_report& r) { return fixed(r.jct_s, 2); }},
      {"agents done p50/p90 (s)",
       [](const mode_report& r) {
         return fixed(r.agents_done_p50_s, 2) + " / "
                + fixed(r.agents_done_p90_s, 2);
       }},
      {"JCT / bound",
       [](const mode_report& r) {
         return fixed(r.jct_over_bound, 2) + "x " + bound_label(r.bound.name);
       }},
      {"tokens/s",
       [](const mode_report& r) { return fixed(r.tokens_per_s, 0); }},
      {"TTFT p50 / p99 (s)",
       [](const mode_report& r) {
         return fixed(r.ttft_p50_s, 3) + " / " + fixed(r.ttft_p99_s, 3);
       }},
      {"TTST p50 / p99 (s)",
       [](const mode_report& r) {
         return fixed(r.ttst_p50_s, 3) + " / " + fixed(r.ttst_p99_s, 3);
       }},
      {"TPOT p50 / p99 (ms)",
       [](const mode_report& r) {
         return fixed(r.tpot_p50_s * 1e3, 1) + " / "
                + fixed(r.tpot_p99_s * 1e3, 1);
       }},
      {"SLO attainment",
       [](const mode_report& r) { return fixed(r.slo_attainment, 3); }},
      {"SNIC util PE / DE",
       [](const mode_report& r) {
         return fixed(r.snic_util_pe, 3) + " / " + fixed(r.snic_util_de, 3);
       }},
      {"SNIC Max/Avg",
       [](const mode_report& r) { return fixed(r.snic_max_over_avg, 2); }},
      {"read PE side",
       [](const mode_report& r) { return bytes_text(r.bytes_read_pe_side); }},
      {"read DE side",
       [](const mode_report& r) { return bytes_text(r.bytes_read_de_side); }},
      {"compute network",
       [](const mode_report& r) { return bytes_text(r.bytes_compute_net); }},
      {"blocks verified",
       [](const mode_report& r) { return std::to_string(r.blocks_verified); }},
      {"verify failures",
       [](const mode_report& r) { return std::to_string(r.verify_failures); }},
      {"recomputed blocks",
       [](const mode_report& r) {
         return std::to_string(r.recomputed_blocks);
       }},
      {"wall (s)", [](const mode_report& r) { return fixed(r.wall_s, 1); }},
      {"timer lag p99 (ms)",
       [](const mode_report& r) { return fixed(r.lag_p99_ms, 1); }},
      {"control RTT p50/p99 ms",
       [](const mode_report& r) {
         return fixed(r.control_rtt_p50_ms, 2) + " / "
                + fixed(r.control_rtt_p99_ms, 2);
       }},
      {"setup+stop (s)",
       [](const mode_report& r) { return fixed(r.setup_s, 1); }},
  };
  const int name_w = 22;
  const int col_w = 22;
  out << std::left << std::setw(name_w) << "metric";
  for (auto& m : modes)
    out << std::right << std::setw(col_w) << m.mode;
  out << '\n';
  for (auto& rw : rows) {
    out << std::left << std::setw(name_w) << rw.name;
    for (auto& m : modes)
      out << std::right << std::setw(col_w) << rw.fn(m);
    out << '\n';
  }
  if (reroutes == reroute_row::show) {
    out << std::left << std::setw(name_w) << "rerouted requests";
    for (auto& m : modes)
      out << std::right << std::setw(col_w) << std::to_string(m.reroutes);
    out << '\n';
  }
}

void print_bounds(std::ostream& out, const fluid_bounds& b,
                  const std::vector<mode_report>& modes) {
  out << "bounds (fluid, from the replayed trace; actors/cluster/bounds.hpp):\n"
      << "  prefill compute   " << std::setw(10)
      << fixed(b.prefill_compute_s, 2)
      << " s  = " << fixed(b.prefill_flops / 1e15, 1) << " PFLOP / "
      << fixed(b.pe_flops_per_s / 1e15, 2) << " PFLOP/s (PE GPUs)\n"
      << "  PE storage NICs   " << std::setw(10) << fixed(b.pe_snic_s, 2)
      << " s  = " << bytes_text(b.hit_bytes) << " hit KV / "
      << bytes_text(static_cast<uint64_t>(b.pe_snic_bytes_per_s)) << "/s\n"
      << "  all storage NICs  " << std::setw(10) << fixed(b.all_snic_s, 2)
      << " s  = " << bytes_text(b.hit_bytes) << " hit KV / "
      << bytes_text(static_cast<uint64_t>(b.all_snic_bytes_per_s)) << "/s\n";
  for (auto& m : modes)
    out << "  " << m.mode << ": JCT " << fixed(m.jct_s, 2)
        << " s = " << fixed(m.jct_over_bound, 2) << "x its bound ("
        << (m.bound.name.empty() ? std::string{"none"} : m.bound.name) << ", "
        << fixed(m.bound.s, 2) << " s); agents done p50 / p90 "
        << fixed(m.agents_done_p50_s, 2) << " / "
        << fixed(m.agents_done_p90_s, 2) << " s\n";
}

} // namespace dualpath::actors::cluster
