// An observer for the suites that watch actors through the observer
// interface (observe/observer, storage/prefetching_reader): it forwards what
// it receives to a sink actor.
#pragma once

#include <caf/actor.hpp>
#include <caf/send.hpp>

#include "actors/protocol/messages.hpp"
#include "actors/protocol/observer_actor.hpp"

namespace dualpath::test {

/// Forwards every snapshot, and every event when `events`, to `sink`.
inline actors::observer_actor::behavior_type
forwarder(actors::observer_actor::pointer, caf::actor sink, bool events) {
  return {
      [sink](actors::snapshot_atom, const actors::state_snapshot& s) {
        caf::anon_send(sink, actors::snapshot_atom_v, s);
      },
      [sink, events](actors::event_atom, const actors::event_record& e) {
        if (events)
          caf::anon_send(sink, actors::event_atom_v, e);
      },
  };
}

} // namespace dualpath::test
