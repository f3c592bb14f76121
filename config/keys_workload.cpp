// [workload]: the agentic trace to replay. Defaults = trace-64k.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_workload(std::vector<key_spec>& out) {
  out.push_back(profile_key("workload", "trace-64k"));
  out.push_back(int_key("workload.turns", 157, "turns",
                        "Mean turns per trajectory.", range::at_least(1)));
  out.push_back(int_key("workload.append_tokens", 429, "tokens",
                        "Mean tokens appended to the prompt per turn.",
                        range::at_least(1)));
  out.push_back(int_key("workload.gen_tokens", 176, "tokens",
                        "Mean tokens generated per turn.", range::at_least(1)));
  out.push_back(int_key("workload.context_tokens", 32721, "tokens",
                        "Mean context length per turn.", range::at_least(1)));
  out.push_back(int_key("workload.max_len", 65536, "tokens",
                        "Maximum trajectory length (MaxLen).",
                        range::at_least(1)));
  out.push_back(int_key("workload.agents", 16, "agents",
                        "Concurrent agents (trajectories) to run.",
                        range::at_least(1)));
  out.push_back(int_key("workload.seed", 1, "", "Seed of the trace generator.",
                        range::at_least(0)));
}

} // namespace dualpath::config::keys
