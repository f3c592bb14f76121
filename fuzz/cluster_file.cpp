// libFuzzer target: the cluster file parser (actors/node/cluster_file.hpp).
// Whatever the text, parse_cluster returns a cluster or an error; a cluster
// it accepts has a scheduler entry and node names that are unique.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "actors/node/cluster_file.hpp"

using namespace dualpath::actors::node;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto cf = parse_cluster(text, "/fuzz/cluster.toml");
  if (!cf)
    return 0;
  std::set<std::string> names;
  for (auto& n : cf->nodes)
    if (!names.insert(n.name).second)
      __builtin_trap();
  if (cf->find(cf->scheduler) != &cf->scheduler_node())
    __builtin_trap();
  return 0;
}
