// The small cluster the command suites (run, sim, observe) replay on: 1P1D of
// 2 GPUs per node, a few agents, ds-660b at byte scale 656 (one real byte per
// token and layer where bytes do move).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace dualpath::test {

/// `dualpath <command>` on that cluster with `agents` agents, then `extra`;
/// two replayed turns per agent unless `extra` names --turns.
inline std::vector<std::string>
small_cluster(const std::string& command, const std::string& agents,
              const std::vector<std::string>& extra) {
  std::vector<std::string> args{
      dualpath_binary(), command, "--quiet", "--agents", agents,
      "--prefill-nodes", "1", "--decode-nodes", "1",
      // The profiles named: the same cluster for run and sim, not `dualpath
      // run`'s main job.
      "--hardware", "paper-hopper", "--model", "ds-660b", "--set",
      "hardware.gpus_per_node=2",
      // A two-GPU node holds a 37e9-parameter model's weights, not DS-660B's.
      "--set", "model.total_params=37e9", "--byte-scale", "656"};
  args.insert(args.end(), extra.begin(), extra.end());
  if (std::find(extra.begin(), extra.end(), "--turns") == extra.end()) {
    args.emplace_back("--turns");
    args.emplace_back("2");
  }
  return args;
}

} // namespace dualpath::test
