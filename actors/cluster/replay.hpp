// Trace replay: drives a trace of agentic trajectories against a scheduler.
// Each agent submits its turns one after another (zero think time): turn i+1
// is submitted when turn i's result arrives. Offline, every agent starts at
// once; online, agents arrive as a Poisson process at `aps` agents per
// emulated second. Times are emulated (see actors/engines/emulation.hpp).
//
// Ownership: replay() blocks the calling (non-actor) thread until every turn
// has completed, the wall-clock limit passes or `watch` reports the job
// cannot finish; the driver actor it spawns
// (and, monitoring it, one actor per agent) ends with it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engines/emulation.hpp"
#include "actors/protocol/messages.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "scheduler/workload/trajectory.hpp"

namespace dualpath::actors::cluster {

struct replay_options {
  /// Agents per emulated second (online); 0 = offline (all start together).
  double aps = 0;
  /// Seed of the arrival process.
  uint64_t seed = 1;
  /// Maps the actor clock to emulated time (shared with the engines).
  emulated_time time;
  /// Wall-clock limit for the whole replay (0 = none).
  std::chrono::seconds wall_limit{0};
  /// Called from the driver's thread after each completed request with
  /// (done, total, emulated seconds of the latest completion) (optional).
  std::function<void(uint64_t, uint64_t, double)> progress;
  /// Real time only (optional): called from replay()'s own thread every
  /// `watch_period` while requests are open; an error (its context a string
  /// saying why, e.g. every decode node left the deployment) means the job
  /// can no longer finish and ends the replay at once with that reason
  /// instead of waiting for the wall limit. May block (it asks remote
  /// actors) but should answer within a few seconds.
  std::function<caf::error()> watch;
  std::chrono::milliseconds watch_period{1000};
};

/// One replayed request.
struct request_record {
  uint64_t id = 0; ///< The request's id.
  uint64_t agent = 0;
  uint32_t turn = 0;
  uint64_t prompt_tokens = 0;
  uint64_t gen_tokens = 0;
  int64_t arrival_ns = 0; ///< Emulated, since the replay's start.
  request_result result;
  bool failed = false; ///< The scheduler answered with an error.
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_record& x) {
  return f(caf::meta::type_name("request_record"), x.id, x.agent, x.turn,
           x.prompt_tokens, x.gen_tokens, x.arrival_ns, x.result, x.failed,
           x.error);
}

struct replay_outcome {
  std::vector<request_record> records;
  int64_t jct_ns = 0; ///< Emulated time from start to the last completion.
  /// Per agent: emulated time from start to its last completion (JCT is
  /// the maximum).
  std::vector<int64_t> agent_done_ns;
  double wall_s = 0; ///< Wall-clock seconds the replay took.
  /// How late (wall ms) a 20 ms timer fired during the replay: p99 and max.
  /// Lateness stretches emulated times by lateness x time_scale.
  double lag_p99_ms = 0;
  double lag_max_ms = 0;
};

/// Replays the turns of `trace` that are not history (history_turns onward).
/// Request ids are `id_base + i`. Fails with caf::sec::request_timeout when
/// the wall limit passes first, and with caf::sec::runtime_error carrying
/// `watch`'s reason and the count of completed requests when `watch` gives
/// one.
caf::expected<replay_outcome> replay(caf::actor_system& sys,
                                     const scheduler_actor& scheduler,
                                     const scheduler::workload::trace& trace,
                                     const replay_options& opts,
                                     uint64_t id_base = 1);

} // namespace dualpath::actors::cluster
