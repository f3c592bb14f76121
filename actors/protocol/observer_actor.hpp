// The observer interface: anything attached to a running system (found through
// the actor registry) receives periodic state snapshots and event records.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using observer_actor = caf::typed_actor<
    // A periodic state snapshot of one actor.
    caf::reacts_to<snapshot_atom, state_snapshot>,
    // One event (reroute, error, failover, span).
    caf::reacts_to<event_atom, event_record>>;

} // namespace dualpath::actors
