// The modeled bulk backend, for simulations (`dualpath sim`): a write moves no
// byte. post() checks every write as the local backend does (sources inside
// their registration; destination region known to its node on the shared
// modeled fabric, key and bounds) and completes the batch at once, inline on
// the caller's thread, with the bytes it would have moved. How long a transfer
// takes is not decided here: the engines pace nominal bytes on their emulated
// links (actors/engines/emulation.hpp) and wait on the actor clock, simulated
// or not.
//
// Inline completion keeps a simulation single-threaded and deterministic: the
// completion sink runs before post() returns (it typically sends a message to
// the posting actor, which is then handled like any later message).
//
// Thread safety: every member function may be called from any thread
// (registrations and counters are guarded by mutexes). Ownership: a
// registration must not outlive its backend; the fabric is shared by the
// backends of one simulated cluster.
#pragma once

#include <memory>

#include "transport/bulk/backend.hpp"

namespace dualpath::transport::bulk {

/// The regions of every node of one simulated cluster (defined in
/// modeled_backend.cpp).
class modeled_fabric;

std::shared_ptr<modeled_fabric> make_modeled_fabric();

/// A modeled backend named `opts.node` on `fabric`; fails when the fabric
/// already has that node.
caf::expected<std::unique_ptr<backend>>
make_modeled_backend(const options& opts,
                     std::shared_ptr<modeled_fabric> fabric);

} // namespace dualpath::transport::bulk
