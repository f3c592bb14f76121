// The node supervisor (interface: actors/protocol/node_supervisor_actor.hpp)
// runs on the scheduler's node and is the one actor every other node connects
// to over the middleman. It keeps the cluster view: which nodes joined, their
// engines, their bulk-transport endpoints and actor handles, and the cluster's
// time origin. It monitors every actor of every joined node; when one goes down
// (the node was lost: a killed process or an unreachable host arrives as
// remote_link_unreachable) the node leaves the view and the epoch advances.
// Nodes poll the view to connect their bulk transport to new peers and to
// learn about lost ones. A node that joins again under the same name replaces
// its old entry.
//
// The submit gate (a scheduler_actor) sits in front of the scheduler for
// drivers: before a request is queued it indexes the prompt's blocks that
// other processes wrote into the shared store since this process opened it
// (history written by the driver, blocks persisted by decode nodes), so the
// scheduler's hit lookup sees the same storage as every reader.
//
// Ownership: the supervisor owns its view; the gate shares the block store.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "actors/protocol/messages.hpp"
#include "actors/protocol/node_supervisor_actor.hpp"
#include "actors/protocol/scheduler_actor.hpp"

namespace dualpath::transport::storage {
class block_store;
} // namespace dualpath::transport::storage

namespace dualpath::actors::node {

/// Spawns the supervisor. `self` is the scheduler node's own entry (always in
/// the view); joins whose settings digest differs from `self`'s are refused.
node_supervisor_actor spawn_supervisor(caf::actor_system& sys, node_info self,
                                       int64_t origin_unix_ns);

/// Spawns the submit gate in front of `scheduler`.
scheduler_actor
spawn_submit_gate(caf::actor_system& sys, scheduler_actor scheduler,
                  std::shared_ptr<transport::storage::block_store> store,
                  uint32_t block_tokens);

/// Indexes the leading blocks of `tokens` that exist in the store's directory
/// but not in its index (written by another process). Returns how many it
/// indexed.
uint32_t adopt_blocks(transport::storage::block_store& store,
                      const token_list& tokens, uint32_t block_tokens);

} // namespace dualpath::actors::node
