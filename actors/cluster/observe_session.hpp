// One process's observation: the metrics registry, the Prometheus endpoint
// (actors/observe/http_server.hpp, path /metrics), the observer hub actor
// (registered in the actor registry, actors/observe/observer.hpp) and the
// timeline written at the end (--trace). A job creates one session for its
// actor system and, per embedded cluster, hooks (the recorder that the
// cluster's actors call) and a watch over the cluster's links.
//
// Ownership: the session owns the endpoint (stopped by the destructor) and
// the timeline; the hub is an actor, told to exit by the destructor.
// Thread safety: make, hooks_for, watch, finish and the destructor from the
// owning thread; the hooks it hands out from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engines/emulation.hpp"
#include "actors/engines/engine_context.hpp"
#include "actors/observe/hooks.hpp"
#include "actors/observe/observer.hpp"
#include "config/settings.hpp"

namespace dualpath::actors::observe {
class metrics_registry;
class timeline;
class http_server;
} // namespace dualpath::actors::observe

namespace dualpath::actors::cluster {

/// The hooks of one cluster: metrics into the session's registry, spans into
/// its timeline, events to its hub. bind() gives it the cluster's emulated
/// time once the cluster exists (before any actor of it reports).
class cluster_hooks : public observe::hooks {
public:
  virtual void bind(const emulated_time& time) = 0;
};

struct observe_options {
  /// Address and port of the /metrics endpoint; port 0 = no endpoint.
  std::string metrics_address = "127.0.0.1";
  uint16_t metrics_port = 0;
  /// Chrome trace-event JSON written by finish(); empty = no timeline.
  std::string trace_file;
  /// Period of the hub's snapshots to attached observers.
  std::chrono::milliseconds snapshot_period{1000};
};

/// Reads the `observe.*` keys.
observe_options observe_options_from(const config::settings& cfg);

class observe_session {
public:
  /// Starts the hub and, if configured, the endpoint (fails when the port
  /// cannot be bound).
  static caf::expected<std::unique_ptr<observe_session>>
  make(caf::actor_system& sys, observe_options opts);

  ~observe_session();

  observe_session(const observe_session&) = delete;
  observe_session& operator=(const observe_session&) = delete;

  /// Hooks for the actors of one cluster, running mode `section`: their
  /// series carry the label mode=`section` and their timeline spans go into
  /// the section `section`; the hub labels snapshots and events with it
  /// from now on.
  std::shared_ptr<cluster_hooks> hooks_for(const std::string& section);

  /// Turns the byte counters of `nodes` (storage NIC, DRAM, compute NICs,
  /// bulk transport per traffic class; bulk bytes times `byte_scale` to
  /// nominal) into metrics labelled mode=`mode` until the returned handle
  /// is destroyed (a last collection runs then).
  std::shared_ptr<void> watch(const std::vector<node_ptr>& nodes,
                              uint32_t byte_scale, const std::string& mode);

  observe::observer_hub_actor hub() const {
    return hub_;
  }

  const std::shared_ptr<observe::metrics_registry>& metrics() const {
    return metrics_;
  }

  /// The endpoint's port (0: none).
  uint16_t metrics_port() const;

  /// Whether anything can see what hooks record: a metrics endpoint, a
  /// timeline file or periodic snapshots to observers.
  bool observed() const;

  /// Spans recorded so far (0 without a timeline).
  size_t spans() const;

  /// Writes the timeline (if configured); may be called again later (the
  /// file is replaced atomically with everything recorded so far).
  caf::error finish();

private:
  explicit observe_session(observe_options opts);

  observe_options opts_;
  std::shared_ptr<observe::metrics_registry> metrics_;
  std::shared_ptr<observe::timeline> timeline_;
  std::unique_ptr<observe::http_server> server_;
  observe::observer_hub_actor hub_;
  // The current mode, shared with the hub (read on its thread).
  struct mode_cell {
    std::mutex mtx;
    std::string mode;
  };
  std::shared_ptr<mode_cell> mode_;
};

} // namespace dualpath::actors::cluster
