// The main job behind `dualpath run`: generate (or load) a trace, then for
// each mode build a block store pre-populated with every trajectory's
// history and an embedded cluster on the same trace and hardware, replay the
// trace and summarise it.
//
// Replay window: each trajectory replays `turns` turns starting at half of
// its own length; the earlier turns are history whose KV is written into the
// store before the mode runs. turns = 0 replays whole trajectories: every
// turn from the first, with no history (a trace file's own `history` turns
// excepted: they are in storage by the file's statement). Each mode gets a
// store of its own (blocks one mode persists would be extra hits for the next),
// and a request's result is reported only after its blocks are durable, so a
// later turn of the same agent sees them.
//
// Thread safety: run_job blocks its caller; it owns the actor system it runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/cluster/cluster.hpp"
#include "actors/cluster/report.hpp"
#include "actors/engines/engine_context.hpp"
#include "config/settings.hpp"
#include "scheduler/workload/generator.hpp"
#include "scheduler/workload/trajectory.hpp"

namespace dualpath::actors::cluster {

/// One compared configuration: a loading mode and, for the ablation's
/// "+dual path" step, round-robin placement instead of the scheduler.
struct run_variant {
  std::string name;
  load_mode mode = load_mode::dualpath;
  /// Round-robin placement with the shorter-queue path choice (the paper's
  /// dual path without its scheduler).
  bool round_robin = false;
};

/// Parses "all", "ablation" or a comma list of basic, layerwise,
/// dualpath-rr, dualpath, oracle; fails naming the unknown item.
caf::expected<std::vector<run_variant>> parse_variants(const std::string& text);

/// Where a job is, for a progress line.
struct job_progress {
  enum class phase : uint8_t {
    /// Writing the trajectories' histories into the mode's store (done and
    /// total count agents).
    populate,
    /// Replaying the trace (done and total count requests).
    replay,
  };
  phase step = phase::replay;
  std::string mode;
  uint64_t done = 0;
  uint64_t total = 0;
  /// Emulated seconds of the latest completed request (replay only).
  double emulated_s = 0;
};

struct job_options {
  /// Variants run in order (see run_variant).
  std::vector<run_variant> modes{{"basic", load_mode::basic, false},
                                 {"dualpath", load_mode::dualpath, false},
                                 {"oracle", load_mode::oracle, false}};
  /// Turns replayed per trajectory from its middle; 0 = every turn from the
  /// first (whole trajectories; see the file comment).
  uint32_t turns = 2;
  /// Agents per emulated second (online); 0 = offline.
  double aps = 0;
  /// A trace file (JSON lines) to replay instead of generating one.
  std::optional<std::string> trace_file;
  /// Where the block store lives ("" = a temporary directory, removed after).
  std::string store_dir;
  /// Wall-clock limit per mode.
  std::chrono::seconds wall_limit{600};
  /// Called as the job advances: from the caller's thread while a mode's
  /// store is populated, from an actor thread after each completed request.
  std::function<void(const job_progress&)> progress;
  /// Lines for the operator, each distinct one passed once per job, from
  /// any thread: the GPU plan (backend and why), the rank -> device map,
  /// GPU memory staged through host memory for RDMA. Null: collected in
  /// job_result::notices only.
  std::function<void(const std::string&)> notice;
  /// Period (wall) of the storage-NIC utilisation samples for timelines.
  std::chrono::milliseconds sample_period{100};
  /// Simulation (`dualpath sim`): the actor system runs in simulated time
  /// (scheduler.policy = testing, driven by actors/sim/driver.hpp) and the
  /// data plane is modeled (an in-memory block store without KV bytes, a
  /// modeled bulk backend, no verification). Timelines then hold only the
  /// first and last sample.
  bool simulate = false;
};

/// Storage-NIC bytes of every node at one emulated instant.
struct snic_sample {
  double t_s = 0;
  std::vector<uint64_t> bytes; ///< Per node, in nodes' order.
};

/// What a mode's plots draw: its storage NICs' bytes over time and the
/// distributions behind its percentiles.
struct mode_timeline {
  std::string mode;
  std::vector<std::string> nodes;
  std::vector<engine_role> roles; ///< Per node: prefill or decode side.
  std::vector<uint64_t> rates;    ///< Per node, bytes/s.
  std::vector<snic_sample> samples;
  /// Emulated seconds at which each agent finished, ascending.
  std::vector<double> agent_done_s;
  /// Every completed request's TTFT (s), ascending.
  std::vector<double> ttft_s;
};

/// A request whose KV did not verify (mode, request, agent, turn).
struct verify_failure {
  std::string mode;
  uint64_t request = 0;
  uint64_t agent = 0;
  uint32_t turn = 0;
  uint32_t blocks = 0;
};

/// How busy one class of emulated links was over a mode's JCT: nominal bytes
/// / (rate x JCT), mean and max over the links of the class. Classes follow
/// `dualpath plan`: pe_cnic_read / pe_cnic_write (a prefill GPU's compute NIC
/// in / out), de_cnic_read / de_cnic_write, pe_dram / de_dram (per node, half
/// duplex), pe_snic / de_snic.
struct link_load {
  std::string link;
  double mean_util = 0;
  double max_util = 0;
};

/// What simulating one mode cost (job_options::simulate only).
struct sim_mode_stats {
  std::string mode;
  uint64_t events = 0;          ///< Jobs (message deliveries) run.
  uint64_t timeouts = 0;        ///< Timeouts fired (simulated-time jumps).
  double wall_s = 0;            ///< Wall seconds of the replay.
  double scheduler_cpu_s = 0;   ///< CPU seconds in the scheduler's handlers.
  double scheduler_wall_s = 0;  ///< Wall seconds of the same handlers.
  std::vector<link_load> links; ///< Link utilisation by class.
  /// Jobs by actor name, most first (where the simulation spends events).
  std::vector<std::pair<std::string, uint64_t>> jobs_by_actor;
};

struct job_result {
  std::vector<mode_report> modes;
  /// Where the engines' KV lived (`dualpath sim`: host, counted only).
  gpu_plan gpus;
  /// Every distinct job_options::notice line, in order.
  std::vector<std::string> notices;
  std::vector<sim_mode_stats> sim; ///< Per mode, simulations only.
  std::vector<mode_timeline> timelines;
  std::vector<verify_failure> failures;
  uint64_t agents = 0;
  uint64_t requests_per_mode = 0;
  uint64_t populated_blocks = 0;
  double mean_prompt_tokens = 0;
  double mean_hit_share = 0; ///< History tokens / prompt tokens, first turn.
  /// Fluid bounds of the replayed trace on the cluster (bounds.hpp).
  fluid_bounds bounds;
  uint32_t byte_scale = 1;
  double time_scale = 1;
  double populate_s = 0; ///< Wall seconds spent pre-populating the store.
  double wall_s = 0;
};

/// The generator's parameters from the workload.* keys.
scheduler::workload::generator_params
generator_params_from(const config::settings& cfg);

/// The trace the job replays (generated from workload.* or loaded), with the
/// replay window applied.
caf::expected<scheduler::workload::trace> job_trace(const config::settings& cfg,
                                                    const job_options& opts);

/// Runs every mode of `opts` in order (see file comment).
caf::expected<job_result> run_job(const config::settings& cfg,
                                  const job_options& opts);

} // namespace dualpath::actors::cluster
