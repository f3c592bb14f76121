// The simulation driver: the same actors as a real-time run, executed by
// CAF's deterministic scheduler (scheduler.policy = testing, i.e.
// caf::scheduler::test_coordinator) with simulated time. One thread runs every
// job (one message of one actor) in FIFO order; when no job is left, time
// jumps to the earliest pending timeout (delayed message or request timeout),
// which fires and makes new jobs. Delayed messages are how every actor waits
// (actors/engines/emulation.hpp), so emulated link and compute times pass
// without any wall-clock time. For a given input the order of jobs, and so
// every result, is the same on every run.
//
// The functions here are no-ops (or false) on a system with a real scheduler,
// so code shared with `dualpath run` (the cluster builder, the replay) calls
// them unconditionally before it blocks on a reply.
//
// Thread safety: call from the one thread that owns the simulated system
// (never from an actor). The event counter is process-wide and atomic.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace caf::scheduler {
class test_coordinator;
} // namespace caf::scheduler

namespace dualpath::actors::sim {

/// The test coordinator of `sys`, or nullptr when `sys` runs in real time.
caf::scheduler::test_coordinator* coordinator(caf::actor_system& sys);

/// Whether `sys` runs in simulated time.
bool simulated(caf::actor_system& sys);

/// Runs every job that is ready without advancing simulated time (so that a
/// blocking caller's request is answered). Returns the jobs run; 0 and a
/// no-op in real time.
uint64_t settle(caf::actor_system& sys);

/// How run_until ended.
enum class run_outcome : uint8_t {
  /// `done` returned true.
  done = 0,
  /// No job and no pending timeout are left, `done` is still false.
  stalled,
  /// The wall-clock limit passed first.
  wall_limit,
};

/// Runs jobs, advancing simulated time to the next timeout whenever none is
/// ready, until `done()` (checked after every job) holds. `wall_limit` of 0
/// means none. Must only be called on a simulated system.
run_outcome run_until(caf::actor_system& sys, const std::function<bool()>& done,
                      std::chrono::steady_clock::duration wall_limit);

/// Jobs (message deliveries) and timeouts run by this process's simulations
/// so far (run_until and settle).
struct event_counts {
  uint64_t jobs = 0;
  uint64_t timeouts = 0;
};

event_counts events();

/// Jobs run by run_until since the last reset, by actor name
/// (abstract_actor::name(): the state's `name` for stateful actors), most
/// first. Deterministic for a given input, like every other count here.
std::vector<std::pair<std::string, uint64_t>> jobs_by_actor();

/// Restarts jobs_by_actor() at zero.
void reset_jobs_by_actor();

/// Measures the CPU time (this thread's CPU clock) of every job of `actor`
/// that run_until runs from now on, replacing an earlier watch; an empty
/// handle stops watching. The total restarts at 0.
void watch(const caf::actor& actor);

/// CPU seconds of the watched actor's jobs since watch().
double watched_cpu_seconds();

/// Wall-clock seconds of the same jobs (with the CPU time: what a dedicated
/// core would spend; more than the CPU time when the host is busy).
double watched_wall_seconds();

} // namespace dualpath::actors::sim
