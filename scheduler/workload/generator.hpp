// Seeded generator of agentic traces shaped like the DualPath paper's datasets
// (Table 2: trace-32k, trace-48k, trace-64k), and the statistics a trace
// actually has.
//
// Table 2's means cannot all hold under the replay rule with the MaxLen cap
// (157 turns x (429 + 176) tokens ~ 95K > 64K). The generator matches the
// per-turn statistics that set a prefill's I/O-to-compute ratio: the mean
// append, the mean generation and the mean context per turn (hence the share
// of prompt tokens that are cache hits, ~98.7% for trace-64k), never exceeds
// MaxLen, and lets the turn count fall where truncation puts it.
// docs/workload.md explains the model and lists what each preset produces.
//
// Model, per trajectory: a turn budget T ~ lognormal (mean `turns`); turn 0
// appends an initial prompt (system prompt, task, repository context) ~
// lognormal; later appends and all generations ~ lognormal; the trajectory
// ends after T turns or before the first turn that would take its context past
// MaxLen. The three lognormal means are solved for by calibrate() on a fixed
// pilot sample so that the pooled means hit the targets.
//
// Thread safety: pure functions; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include "scheduler/workload/trajectory.hpp"

namespace dualpath::scheduler::workload {

/// Targets of the generator: the same numbers as the config keys workload.*.
struct generator_params {
  uint32_t turns = 157;            ///< Mean turn budget per trajectory.
  uint32_t append_tokens = 429;    ///< Mean append per turn (pooled).
  uint32_t gen_tokens = 176;       ///< Mean generation per turn (pooled).
  uint64_t context_tokens = 32721; ///< Mean prompt length per turn (pooled).
  uint64_t max_len = 65536;        ///< MaxLen: cap on a trajectory's context.
  uint32_t agents = 500;           ///< Trajectories to generate.
  uint64_t seed = 1;               ///< Seed of lengths and token ids.
};

/// The Table 2 dataset `name` ("trace-32k", "trace-48k", "trace-64k") with
/// 500 agents and seed 1. Fails with bad_parameter for other names.
caf::expected<generator_params> preset(std::string_view name);

/// Names accepted by preset().
std::vector<std::string> preset_names();

/// The distribution parameters behind a trace (output of calibrate()).
struct generator_model {
  double turns_mean = 0;   ///< Mean of the lognormal turn budget.
  double initial_mean = 0; ///< Mean of turn 0's append (lognormal).
  double append_mean = 0;  ///< Mean of later appends (lognormal).
  double gen_mean = 0;     ///< Mean of generations (lognormal).
  uint64_t max_len = 0;    ///< MaxLen.
  /// Largest relative error of the pilot's pooled append, gen and context
  /// means against the targets (0.01 = 1%). Large when the targets are
  /// infeasible under MaxLen; the generator still returns its best fit.
  double residual = 0;
};

/// Lognormal shape (sigma of the log) of each quantity.
constexpr double turns_sigma = 0.7;
constexpr double initial_sigma = 0.6;
constexpr double append_sigma = 1.0;
constexpr double gen_sigma = 0.8;

/// Solves for the model that makes the pooled per-turn append, generation
/// and context means of a 1000-trajectory pilot (fixed seed, independent of
/// params.seed) equal to the targets. Fails with bad_parameter for zero
/// targets or a context target >= max_len.
caf::expected<generator_model> calibrate(const generator_params& params);

/// A trace of params.agents trajectories (agent ids 0..agents-1) drawn from
/// `model`; token ids use params.seed. Deterministic in (params, model).
trace generate(const generator_params& params, const generator_model& model);

/// calibrate() then generate().
caf::expected<trace> generate(const generator_params& params);

/// "More agents": grows `xs` to `total` trajectories. Each new one samples an
/// original trajectory (source_offset == 0) and prepends a random first turn
/// (append and gen drawn from the trace's own later turns), which gives it a
/// distinct prefix; trailing turns are dropped to stay within `max_len`. New
/// agent ids continue after the largest existing one. Fails with
/// bad_parameter when xs holds no original trajectory with at least 2 turns.
caf::expected<trace> add_agents(const trace& xs, size_t total, uint64_t seed,
                                uint64_t max_len);

/// Statistics a trace actually has, pooled over all turns (history included).
struct trace_stats {
  size_t trajectories = 0;
  double mean_turns = 0;        ///< Turns per trajectory.
  double mean_append = 0;       ///< Append tokens per turn.
  double mean_gen = 0;          ///< Generated tokens per turn.
  double mean_context = 0;      ///< Prompt length per turn.
  double mean_final_length = 0; ///< Context after a trajectory's last turn.
  uint64_t max_final_length = 0;
  /// Share of prompt tokens present from the previous turn (prefix hits):
  /// sum(prompt - append) / sum(prompt).
  double hit_share = 0;
};

trace_stats measure(const trace& xs);

/// One line per statistic, e.g. for a report next to Table 2.
std::string to_string(const trace_stats& x);

} // namespace dualpath::scheduler::workload
