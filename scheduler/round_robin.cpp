#include "scheduler/round_robin.hpp"

#include <algorithm>

#include "scheduler/pe_selection.hpp"

namespace dualpath::scheduler {

round_robin_policy::round_robin_policy(policy_config cfg) : cfg_(cfg) {
}

fetch_result
round_robin_policy::fetch(cluster_state& st, std::deque<request_info>& waiting,
                          const std::vector<uint32_t>& pe_candidates) {
  fetch_result out;
  touched_.clear();
  const auto n = pe_candidates.size();
  const auto groups = static_cast<uint32_t>(st.decode_groups.size());
  if (n == 0 || groups == 0)
    return out;
  while (!waiting.empty()) {
    const auto& r = waiting.front();
    uint32_t pe = UINT32_MAX;
    for (size_t k = 0; k < n; ++k) {
      auto i = pe_candidates[(pe_cursor_ + k) % n];
      if (st.prefill[i].tok <= cfg_.limits.beta_tokens) {
        pe = i;
        pe_cursor_ = (pe_cursor_ + k + 1) % n;
        break;
      }
    }
    if (pe == UINT32_MAX)
      break;
    auto g = group_cursor_ % groups;
    group_cursor_ = (g + 1) % groups;
    out.assigned.push_back(commit_assignment(st, r, pe, g, cfg_.reads));
    if (std::find(touched_.begin(), touched_.end(), g) == touched_.end())
      touched_.push_back(g);
    waiting.pop_front();
  }
  for (auto g : touched_) {
    auto p = place(st, g);
    out.placed.insert(out.placed.end(), p.begin(), p.end());
  }
  order_placed_fifo(out);
  return out;
}

std::vector<de_placement> round_robin_policy::place(cluster_state& st,
                                                    uint32_t group) {
  std::vector<de_placement> out;
  if (engine_cursor_.size() < st.decode_groups.size())
    engine_cursor_.resize(st.decode_groups.size(), 0);
  auto& g = st.decode_groups[group];
  auto& cursor = engine_cursor_[group];
  const auto n = g.members.size();
  while (!g.pending.empty()) {
    const auto& r = g.pending.front();
    auto need = r.decode_hbm_bytes();
    uint32_t de = UINT32_MAX;
    for (size_t k = 0; k < n; ++k) {
      auto i = g.members[(cursor + k) % n];
      if (st.decode[i].free_hbm_bytes >= need) {
        de = i;
        cursor = static_cast<uint32_t>((cursor + k + 1) % n);
        break;
      }
    }
    if (de == UINT32_MAX)
      break;
    auto& e = st.decode[de];
    e.tok += r.prompt_tokens;
    e.seq += 1;
    e.free_hbm_bytes -= need;
    out.push_back(de_placement{r.id, de});
    g.pending.pop_front();
  }
  return out;
}

} // namespace dualpath::scheduler
