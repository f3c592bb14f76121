// Turning a replay into the numbers `dualpath run` reports: JCT, throughput,
// TTFT / TTST / TPOT percentiles, SLO attainment, storage-NIC utilisation per
// side and its Max/Avg across NICs, bytes per path, verification counts; a
// table for humans and JSON for machines.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/cluster/replay.hpp"

namespace dualpath::actors::cluster {

/// What one storage NIC moved during a mode's run (nominal bytes).
struct snic_usage {
  std::string node;
  engine_role role = engine_role::prefill;
  uint64_t bytes = 0;
  uint64_t rate_bytes_per_s = 0;
};

/// Service-level objective of the online experiments (brief section 4).
struct slo {
  double ttft_s = 4.0;
  double tpot_s = 0.050;
};

/// Fluid lower bounds on the JCT of one replayed trace on one cluster shape
/// (computed once per job: actors/cluster/bounds.hpp says how).
struct fluid_bounds {
  double prefill_flops = 0; ///< Prefill FLOPs of every replayed request.
  uint64_t hit_tokens = 0;  ///< Prompt tokens found in storage, all requests.
  uint64_t hit_bytes = 0;   ///< Their nominal KV bytes (all layers).
  double prefill_compute_s = 0; ///< FLOPs / the PE GPUs' aggregate rate.
  double pe_snic_s = 0;  ///< Hit bytes / the PE storage NICs' aggregate rate.
  double all_snic_s = 0; ///< Hit bytes / every storage NIC's aggregate rate.
  double pe_flops_per_s = 0;       ///< The PE GPUs' aggregate FLOP rate.
  double pe_snic_bytes_per_s = 0;  ///< The PE storage NICs' aggregate rate.
  double all_snic_bytes_per_s = 0; ///< Every storage NIC's aggregate rate.
};

/// The bound that applies to one mode: the key of fluid_bounds it is
/// ("prefill_compute", "pe_snic" or "all_snic") and its seconds.
struct mode_bound {
  std::string name;
  double s = 0;
};

struct mode_report {
  std::string mode;
  uint64_t requests = 0;
  uint64_t failed_requests = 0;
  /// The first failed request's error (empty when none failed): what a user
  /// reads first when requests fail.
  std::string first_error;
  double jct_s = 0;
  /// When half / 90% of the agents had finished (JCT: all of them). With
  /// few replayed turns JCT is the longest agent's chain; these are not.
  double agents_done_p50_s = 0;
  double agents_done_p90_s = 0;
  /// The fluid bound that applies to the mode and JCT / its seconds (0
  /// when the bound is 0).
  mode_bound bound;
  double jct_over_bound = 0;
  double tokens_per_s = 0; ///< (prompt + generated tokens) / JCT.
  double ttft_p50_s = 0;
  double ttft_p99_s = 0;
  double ttst_p50_s = 0;
  double ttst_p99_s = 0;
  double tpot_p50_s = 0;
  double tpot_p99_s = 0;
  double slo_attainment = 0; ///< Share of requests meeting both SLOs.
  double snic_util_pe = 0;   ///< Mean utilisation of prefill-node SNICs.
  double snic_util_de = 0;   ///< Mean utilisation of decode-node SNICs.
  double snic_max_over_avg = 0;
  uint64_t bytes_read_pe_side = 0;
  uint64_t bytes_read_de_side = 0;
  uint64_t bytes_compute_net = 0;
  uint64_t blocks_verified = 0;
  uint64_t verify_failures = 0;
  uint64_t recomputed_blocks = 0;
  uint64_t blocks_persisted = 0; ///< Full Blocks written after decode.
  uint64_t reroutes = 0;
  /// Storage reads and decode-side reservations that waited for room in a
  /// node's DRAM buffer.
  uint64_t buffer_waits = 0;
  double wall_s = 0;     ///< Wall seconds of the replay.
  double setup_s = 0;    ///< Wall seconds building and stopping the cluster.
  double lag_p99_ms = 0; ///< Timer lateness p99 (wall ms), see replay.hpp.
  /// Round trip of the control message that placed each request (the
  /// prefill engine's fetch to the scheduler and its reply; wall ms on the
  /// engine's actor clock, 0 in simulated time), over the requests that
  /// have one (request_result::control_rtt_ns); 0 when none has.
  double control_rtt_p50_ms = 0;
  double control_rtt_p99_ms = 0;
};

/// The p-quantile (0..1, nearest rank) of `xs` (0 for an empty vector).
double quantile(std::vector<double> xs, double p);

/// Summarises one mode's replay and its storage NICs' traffic.
mode_report summarize(const std::string& mode, const replay_outcome& outcome,
                      const std::vector<snic_usage>& snics, const slo& goal);

/// The JSON object of one mode (keys as documented in README/`run --help`).
nlohmann::json to_json(const mode_report& r);

/// Sets r.bound and r.jct_over_bound.
void set_bound(mode_report& r, mode_bound b);

/// The JSON object of the bounds (prefill_compute_s, pe_snic_s, all_snic_s,
/// and the totals behind them: prefill_flops, hit_tokens, hit_bytes).
nlohmann::json to_json(const fluid_bounds& b);

/// Whether the table has a row of requests rerouted after a node loss (only
/// a deployment can lose a node).
enum class reroute_row : uint8_t { hide, show };

/// A fixed-width table of the modes, one row per metric, one column per mode.
void print_table(std::ostream& out, const std::vector<mode_report>& modes,
                 reroute_row reroutes = reroute_row::hide);

/// The bounds block: each bound in seconds with what it divides, then each
/// mode's JCT over the bound that applies to it.
void print_bounds(std::ostream& out, const fluid_bounds& b,
                  const std::vector<mode_report>& modes);

} // namespace dualpath::actors::cluster
