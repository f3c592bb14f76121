// The observer hub: the actor a running system's observers attach to. It
// implements observer_actor (actors/protocol/observer_actor.hpp) and adds
// `attach`:
//  - attach(caf::actor): the subscriber (any actor that handles
//    observer_actor's messages) receives from now on every periodic
//    snapshot and every event; it is dropped when it terminates;
//  - snapshot(state_snapshot) from an actor (e.g. a user's behaviour, see
//    docs/extending.md): forwarded to the subscribers, and its samples become
//    series `<sample name>{mode="<mode>",source="<source>"}` of the
//    metrics registry (counters when declared so or named `_total`, else
//    gauges), so they appear on /metrics too;
//  - event(event_record): forwarded; kinds "error" and "tcp_fallback" also
//    count dualpath_errors_total{mode,source} and
//    dualpath_bulk_tcp_fallback_total{mode} (reroutes are the scheduler's to
//    count: it reports them as events and as metrics);
//  - every `snapshot_period` it runs the registry's collectors and sends one
//    state_snapshot per node (source = the node; samples = every series
//    labelled with that node, other labels written into the sample name
//    Prometheus-style) and one for the cluster-wide series (source
//    "cluster").
// The hub puts itself into the actor registry under `observer_name`, so
// anyone holding the actor system finds it: attach_observer() below.
//
// Ownership: the hub shares the metrics registry with the endpoint and the
// recorders. Thread safety: actor.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/typed_actor.hpp>

#include "actors/protocol/observer_actor.hpp"

namespace dualpath::actors::observe {

class metrics_registry;

/// The hub's interface: the observer interface plus attach.
using observer_hub_actor = observer_actor::extend<
    // Subscribe an actor that handles snapshot and event messages.
    caf::reacts_to<attach_atom, caf::actor>>;

/// The name under which the hub is in the actor registry.
constexpr caf::atom_value observer_name = caf::atom("dp_observe");

struct observer_hub_config {
  std::shared_ptr<metrics_registry> metrics;
  /// Period of the snapshots (actor clock; 0 = no periodic snapshots).
  std::chrono::milliseconds snapshot_period{1000};
  /// The mode the process runs now (a process runs its modes one after
  /// another): the `mode` label of the series made from snapshots and
  /// events; unset or empty: no mode label. Called on the hub's thread.
  std::function<std::string()> mode;
};

/// Spawns the hub and registers it under observer_name (replacing an older
/// entry). The registry entry is removed when the hub terminates.
observer_hub_actor spawn_observer_hub(caf::actor_system& sys,
                                      observer_hub_config cfg);

/// Finds the hub of `sys` in the actor registry (invalid when none).
observer_hub_actor find_observer_hub(caf::actor_system& sys);

/// Subscribes `subscriber` to the hub of `sys`; false when no hub runs.
bool attach_observer(caf::actor_system& sys, const caf::actor& subscriber);

} // namespace dualpath::actors::observe
