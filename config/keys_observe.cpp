// [observe]: metrics endpoint, observer snapshots and timelines
// (docs/observability.md).
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_observe(std::vector<key_spec>& out) {
  section_keys s{out, "observe"};
  s.integer("metrics_port", 0, "port", range::between(0, 65535),
            "TCP port of the Prometheus endpoint "
            "(http://<metrics_address>:<port>/metrics); 0 = no endpoint.");
  s.string(
      "metrics_address", "127.0.0.1",
      "IPv4 address the metrics endpoint binds (0.0.0.0 for every interface).");
  s.integer("snapshot_period_ms", 1000, "ms", range::at_least(1),
            "How often the observer hub sends state snapshots to attached "
            "observers.");
  s.string("trace_file", "",
           "Write a Chrome trace-event JSON timeline (open in "
           "https://ui.perfetto.dev) of every request's per-layer steps here; "
           "empty = no timeline.");
}

} // namespace dualpath::config::keys
