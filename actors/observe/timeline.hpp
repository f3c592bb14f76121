// A timeline of spans written as Chrome trace-event JSON (the "JSON Array /
// Object Format" that chrome://tracing and https://ui.perfetto.dev open).
//
// Layout: one process per node (prefixed with a section, e.g. the run's
// mode: "dualpath pe0"), one thread track per engine ("gpu0") and per NIC
// ("snic", "cnic0"). Spans are complete events ("ph":"X") with their
// request id, layer and bytes in `args`; timestamps are emulated
// microseconds since the cluster's start. Flow events ("ph":"s"/"f") join
// each layer's "send" span on a prefill node to the "receive" span of the
// same section, request and layer at the decode node. Written with
// nlohmann-json.
//
// Nesting: viewers require the slices of one thread track to nest (a slice
// either contains another or is disjoint from it). Spans that overlap
// without nesting (a decode engine's concurrent requests, loads of several
// layers in flight) are spread over extra lanes of the same track, named
// "gpu0 #2", ...; assign_lanes() is that placement, and it keeps a span on
// the lane of the span that contains it when there is one.
//
// Thread safety: add() may be called from any thread; the rest from one.
// Ownership: the timeline owns its spans.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <caf/error.hpp>

#include "actors/observe/hooks.hpp"

namespace dualpath::actors::observe {

/// A span placed on a lane of its track.
struct placed_span {
  span_record span;
  uint32_t lane = 0;
};

/// Places spans of one track on lanes so that each lane's spans nest (see
/// file comment). The result is sorted by begin time.
std::vector<placed_span> assign_lanes(std::vector<span_record> spans);

class timeline {
public:
  /// Prefix of the process names of spans added from now on ("" = none).
  void set_section(const std::string& section);

  void add(span_record x);

  size_t size() const;

  /// The whole trace as a JSON object {"traceEvents": [...], ...}.
  std::string to_json() const;

  /// Writes to_json() to `path` (replaced atomically: a temporary file,
  /// then rename). Fails with caf::sec::runtime_error naming the path.
  caf::error write(const std::string& path) const;

private:
  mutable std::mutex mtx_;
  std::string section_;
  std::vector<span_record> spans_; // node already carries the section
};

} // namespace dualpath::actors::observe
