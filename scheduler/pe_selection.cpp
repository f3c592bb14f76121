#include "scheduler/pe_selection.hpp"

namespace dualpath::scheduler {

std::optional<uint32_t> choose_prefill(const cluster_state& st,
                                       const std::vector<uint32_t>& candidates,
                                       const thresholds& th) {
  // Best per class in one pass: class 0 = short read queue, 1 = long.
  uint32_t best[2] = {0, 0};
  uint64_t best_tok[2] = {UINT64_MAX, UINT64_MAX};
  bool found[2] = {false, false};
  for (auto i : candidates) {
    const auto& e = st.prefill[i];
    if (e.tok > th.beta_tokens)
      continue;
    int cls = st.nodes[e.node].read_q <= th.alpha_tokens ? 0 : 1;
    if (!found[cls] || e.tok < best_tok[cls]) {
      found[cls] = true;
      best[cls] = i;
      best_tok[cls] = e.tok;
    }
  }
  if (found[0])
    return best[0];
  if (found[1])
    return best[1];
  return std::nullopt;
}

void commit_prefill(cluster_state& st, uint32_t pe, const request_info& r,
                    uint64_t pe_side_read_tokens) {
  auto& e = st.prefill[pe];
  e.tok += r.prompt_tokens;
  e.seq += 1;
  auto& n = st.nodes[e.node];
  n.read_q += pe_side_read_tokens;
  e.read_q = n.read_q;
}

} // namespace dualpath::scheduler
