// [workload]: the agentic trace to replay. Defaults = trace-64k.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_workload(std::vector<key_spec>& out) {
  section_keys s{out, "workload"};
  s.profile("trace-64k");
  s.integer("turns", 157, "turns", range::at_least(1),
            "Mean turns per trajectory.");
  s.integer("append_tokens", 429, "tokens", range::at_least(1),
            "Mean tokens appended to the prompt per turn.");
  s.integer("gen_tokens", 176, "tokens", range::at_least(1),
            "Mean tokens generated per turn.");
  s.integer("context_tokens", 32721, "tokens", range::at_least(1),
            "Mean context length per turn.");
  s.integer("max_len", 65536, "tokens", range::at_least(1),
            "Maximum trajectory length (MaxLen).");
  s.integer("agents", 16, "agents", range::at_least(1),
            "Concurrent agents (trajectories) to run.");
  s.integer("seed", 1, "", range::at_least(0), "Seed of the trace generator.");
}

} // namespace dualpath::config::keys
