// The global scheduler actor (interface: actors/protocol/scheduler_actor.hpp):
// one waiting queue for the whole cluster, driven by the engine groups'
// leaders. It is a thin wrapper around the pure policies of scheduler/
// (policy.hpp):
//  - submit: looks the prompt up in the block store (hit blocks), queues it;
//    the reply is the request's result, sent when its decode engine reports
//    it done;
//  - fetch (prefill leader): records its group's load, runs the policy's
//    fetch over every prefill engine, and replies with the group's complete
//    assignments (PE, DE, read plan); requests whose decode engine is chosen
//    later (a decode group was full) are pushed to their prefill engine with
//    `prefill` as soon as a decode report places them;
//  - report (decode leader): records the group's load and places pending
//    requests on its engines;
//  - enroll: learns an engine's handle and monitors it;
//  - fail: an engine's attempt at a request failed (a transport, storage or
//    admission error): the request goes back to the head of the queue, a
//    reroute like an engine loss's; after max_attempts attempts its
//    submitter gets the last error instead. A report of an earlier attempt
//    (the engine's id carries the attempt) or of a request already
//    re-queued is ignored, so a failure and an engine loss re-queue once.
// Every request is tracked to completion: none is lost, none duplicated.
//
// Ownership: the actor owns its cluster_state and queues; the block store is
// shared (read-only lookups).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/observe/hooks.hpp"
#include "actors/protocol/observer_actor.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "scheduler/policy.hpp"

namespace dualpath::transport::storage {
class block_store;
} // namespace dualpath::transport::storage

namespace dualpath::actors {

/// An engine as the scheduler knows it before it enrolls.
struct scheduled_engine {
  engine_id id;
  uint32_t group = 0; ///< Dense per role.
  uint32_t node = 0;  ///< Index into scheduler_config::nodes.
};

/// What the scheduler is built with.
struct scheduler_config {
  scheduler::policy_config policy;
  std::vector<scheduled_engine> prefill;
  std::vector<scheduled_engine> decode;
  /// Per node (PE and DE nodes alike): its storage read rate.
  std::vector<scheduler::node_state> nodes;
  uint32_t block_tokens = 64;
  /// Nominal KV bytes per token over all layers.
  uint64_t kv_bytes_per_token = 0;
  /// Block index used to find each prompt's hit blocks.
  std::shared_ptr<transport::storage::block_store> store;
  /// Receives events (optional).
  observer_actor observer;
  /// Optional (null: not observed): request and engine-load metrics.
  observe::hooks_ptr hooks;
};

/// Counters the scheduler keeps (also reported through `status`-like
/// snapshots to the observer).
struct scheduler_counters {
  uint64_t submitted = 0;
  uint64_t assigned = 0;
  uint64_t placed = 0;
  uint64_t completed = 0;
  uint64_t fetches = 0;
  uint64_t empty_fetches = 0;
  /// Requests re-queued because an engine holding them was lost.
  uint64_t rerouted = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduler_counters& x) {
  return f(caf::meta::type_name("scheduler_counters"), x.submitted, x.assigned,
           x.placed, x.completed, x.fetches, x.empty_fetches, x.rerouted);
}

/// Attempts a request gets before a failure report fails its submitter.
constexpr uint32_t max_attempts = 8;

/// Spawns the scheduler. Fails with caf::sec::invalid_argument (naming the
/// problem) when the engine and node tables are inconsistent.
caf::expected<scheduler_actor> spawn_scheduler(caf::actor_system& sys,
                                               scheduler_config cfg);

} // namespace dualpath::actors
