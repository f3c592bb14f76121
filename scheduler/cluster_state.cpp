#include "scheduler/cluster_state.hpp"

#include <algorithm>

#include <caf/error.hpp>
#include <caf/sec.hpp>

namespace dualpath::scheduler {

caf::expected<cluster_state>
cluster_state::make(std::vector<engine_state> prefill,
                    std::vector<engine_state> decode,
                    std::vector<node_state> nodes) {
  auto bad = [](std::string why) {
    return caf::make_error(caf::sec::invalid_argument, std::move(why));
  };
  std::string why;
  cluster_state st;
  for (const auto& n : nodes)
    if (!(n.read_tokens_per_s > 0)) {
      return bad("node read rate must be positive");
    }
  auto check_nodes = [&](const std::vector<engine_state>& es) {
    for (const auto& e : es)
      if (e.node >= nodes.size()) {
        why = "engine " + std::to_string(e.id) + " names node "
              + std::to_string(e.node) + " of " + std::to_string(nodes.size());
        return false;
      }
    return true;
  };
  if (!check_nodes(prefill) || !check_nodes(decode))
    return bad(why);
  uint32_t groups = 0;
  for (const auto& e : decode)
    groups = std::max(groups, e.group + 1);
  st.decode_groups.resize(groups);
  for (uint32_t i = 0; i < decode.size(); ++i) {
    auto& g = st.decode_groups[decode[i].group];
    if (!g.members.empty() && g.node != decode[i].node) {
      return bad("decode group " + std::to_string(decode[i].group)
                 + " spans several nodes");
    }
    g.node = decode[i].node;
    g.members.push_back(i);
    g.total_tokens += decode[i].tok;
  }
  for (uint32_t g = 0; g < groups; ++g)
    if (st.decode_groups[g].members.empty()) {
      return bad("decode group ids are not dense: group " + std::to_string(g)
                 + " has no engine");
    }
  // The reports carry the node's queue; the node table is authoritative from
  // here on (the last report of any engine of the node wins).
  for (const auto& e : prefill)
    nodes[e.node].read_q = e.read_q;
  for (const auto& e : decode)
    nodes[e.node].read_q = e.read_q;
  st.prefill = std::move(prefill);
  st.decode = std::move(decode);
  st.nodes = std::move(nodes);
  return st;
}

void cluster_state::update_prefill(uint32_t index, uint32_t seq, uint64_t tok,
                                   uint64_t node_read_q) {
  auto& e = prefill[index];
  e.seq = seq;
  e.tok = tok;
  e.read_q = node_read_q;
  nodes[e.node].read_q = node_read_q;
}

void cluster_state::update_decode(uint32_t index, uint32_t seq, uint64_t tok,
                                  uint64_t node_read_q,
                                  uint64_t free_hbm_bytes) {
  auto& e = decode[index];
  auto& g = decode_groups[e.group];
  g.total_tokens = g.total_tokens - e.tok + tok;
  e.seq = seq;
  e.tok = tok;
  e.read_q = node_read_q;
  e.free_hbm_bytes = free_hbm_bytes;
  nodes[e.node].read_q = node_read_q;
}

} // namespace dualpath::scheduler
