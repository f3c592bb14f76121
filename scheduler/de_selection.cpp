#include "scheduler/de_selection.hpp"

namespace dualpath::scheduler {

uint32_t choose_decode_group(const cluster_state& st) {
  uint32_t best = 0;
  for (uint32_t g = 1; g < st.decode_groups.size(); ++g)
    if (st.decode_groups[g].total_tokens < st.decode_groups[best].total_tokens)
      best = g;
  return best;
}

void route_to_group(cluster_state& st, uint32_t group, const request_info& r) {
  auto& g = st.decode_groups[group];
  g.pending.push_back(r);
  g.total_tokens += r.prompt_tokens;
}

double decode_threshold(const cluster_state& st, uint32_t group,
                        double headroom) {
  const auto& g = st.decode_groups[group];
  uint64_t free_total = 0;
  uint64_t tok_total = 0;
  for (auto i : g.members) {
    free_total += st.decode[i].free_hbm_bytes;
    tok_total += st.decode[i].tok;
  }
  // R: the FIFO prefix that fits in the pooled free HBM.
  uint64_t used = 0;
  uint64_t len_r = 0;
  for (const auto& r : g.pending) {
    auto need = r.decode_hbm_bytes();
    if (used + need > free_total)
      break;
    used += need;
    len_r += r.prompt_tokens;
  }
  return headroom * static_cast<double>(len_r + tok_total)
         / static_cast<double>(g.members.size());
}

uint32_t choose_decode_engine(const cluster_state& st, uint32_t group,
                              const request_info& r, double z) {
  const auto& g = st.decode_groups[group];
  auto need = r.decode_hbm_bytes();
  uint32_t under = UINT32_MAX; // best with tok_e + len(r) <= Z: min seq_e
  uint32_t any = UINT32_MAX;   // best overall: min tok_e
  for (auto i : g.members) {
    const auto& e = st.decode[i];
    if (e.free_hbm_bytes < need)
      continue;
    if (static_cast<double>(e.tok + r.prompt_tokens) <= z) {
      if (under == UINT32_MAX || e.seq < st.decode[under].seq
          || (e.seq == st.decode[under].seq && e.tok < st.decode[under].tok))
        under = i;
    }
    if (any == UINT32_MAX || e.tok < st.decode[any].tok)
      any = i;
  }
  return under != UINT32_MAX ? under : any;
}

std::vector<de_placement> place_in_group(cluster_state& st, uint32_t group,
                                         double headroom) {
  std::vector<de_placement> out;
  auto& g = st.decode_groups[group];
  if (g.pending.empty())
    return out;
  auto z = decode_threshold(st, group, headroom);
  while (!g.pending.empty()) {
    const auto& r = g.pending.front();
    auto de = choose_decode_engine(st, group, r, z);
    if (de == UINT32_MAX)
      break;
    auto& e = st.decode[de];
    e.tok += r.prompt_tokens;
    e.seq += 1;
    e.free_hbm_bytes -= r.decode_hbm_bytes();
    out.push_back(de_placement{r.id, de});
    g.pending.pop_front(); // total_tokens unchanged: pending -> tok_e
  }
  return out;
}

} // namespace dualpath::scheduler
