// The observation hook interface: what the engines, the storage reader and the
// scheduler call to report timeline spans and metrics while they work. An
// actor holds a `hooks_ptr` that is null when nothing observes the run; every
// call site is guarded by `if (hooks)`, so an unobserved run pays one pointer
// test per step. The implementation (actors/cluster/observe_session.hpp) feeds
// a metrics registry (Prometheus endpoint), a timeline (Chrome trace-event
// JSON) and the observer hub actor (snapshots, events).
//
// This header needs no library (CAF's type_name is header-only); the wings
// that call hooks (storage, engines, placement) sit above observe/ and never
// need its registry or endpoint.
//
// Times: emulated nanoseconds since the cluster's start (see
// actors/engines/emulation.hpp); `at()` converts an actor-clock time point.
// Thread safety: implementations must be callable from any actor thread.
// Ownership: hooks are shared (shared_ptr) by every actor of a cluster.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace dualpath::actors::observe {

/// Metric labels as (name, value) pairs, in the order they are rendered.
using label_set = std::vector<std::pair<std::string, std::string>>;

/// One step of one request on one track of the timeline.
struct span_record {
  /// The process row of the timeline: the node ("pe0", "de1").
  std::string node;
  /// The track inside the node: an engine ("gpu0") or a NIC ("snic",
  /// "cnic0").
  std::string track;
  /// What happened: "prefill", "decode", "storage read", "transfer", "h2d",
  /// "compute", "send", "persist".
  std::string name;
  uint64_t request_id = 0;
  int32_t layer = -1; ///< -1: the span is not about one layer.
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  uint64_t bytes = 0; ///< Nominal bytes moved (0: none or not applicable).
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, span_record& x) {
  return f(caf::meta::type_name("span_record"), x.node, x.track, x.name,
           x.request_id, x.layer, x.begin_ns, x.end_ns, x.bytes);
}

/// What a metric is (Prometheus types).
enum class metric_kind : uint8_t {
  counter = 0, ///< Only goes up (name ends in `_total`).
  gauge = 1,   ///< Goes up and down.
  histogram =
      2, ///< Observations in buckets (seconds: name ends in `_seconds`).
};

/// The hook interface (see file comment).
class hooks {
public:
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~hooks() = default;

  /// Emulated ns since the cluster's start at actor-clock time `actor_now`.
  virtual int64_t at(time_point actor_now) const = 0;

  /// True when spans are recorded (callers skip building them otherwise).
  virtual bool tracing() const = 0;

  /// Records a finished span (ignored unless tracing()).
  virtual void span(span_record x) = 0;

  /// Declares a metric family that is not one of dualpath's standard ones
  /// (see actors/observe/metrics.cpp): its kind and one line of help.
  virtual void describe(const std::string& name, metric_kind kind,
                        const std::string& help) = 0;

  /// Adds `delta` to a counter (name ends in `_total`).
  virtual void count(const std::string& name, const label_set& labels,
                     double delta = 1) = 0;

  /// Sets a gauge.
  virtual void gauge(const std::string& name, const label_set& labels,
                     double value) = 0;

  /// Adds one observation to a histogram.
  virtual void observe(const std::string& name, const label_set& labels,
                       double value) = 0;

  /// An event for the observer hub and its subscribers (kind: "error",
  /// "reroute", "tcp_fallback", ...; also counted as a metric).
  virtual void event(const std::string& source, const std::string& kind,
                     uint64_t request_id, int64_t at_ns,
                     const std::string& detail) = 0;
};

using hooks_ptr = std::shared_ptr<hooks>;

} // namespace dualpath::actors::observe
