#include "scheduler/policy.hpp"

#include <algorithm>
#include <unordered_map>

#include "config/enum_names.hpp"
#include "scheduler/pe_selection.hpp"
#include "scheduler/round_robin.hpp"

namespace dualpath::scheduler {

constexpr std::string_view policy_kind_names[] = {"basic", "dualpath"};

std::string to_string(policy_kind x) {
  return config::name_of(x, policy_kind_names, "policy_kind");
}

placement_policy::~placement_policy() = default;

void commit_reads(cluster_state& st, uint32_t pe, uint32_t group,
                  const request_info& r, const read_split& s) {
  uint64_t t = r.block_tokens();
  st.nodes[st.prefill[pe].node].read_q += t * s.pe_side_blocks;
  st.prefill[pe].read_q = st.nodes[st.prefill[pe].node].read_q;
  st.nodes[st.decode_groups[group].node].read_q += t * s.de_side_blocks();
}

void order_placed_fifo(fetch_result& out) {
  // Rank of a request in this call's assignments; earlier calls' first.
  std::unordered_map<uint64_t, size_t> rank;
  rank.reserve(out.assigned.size());
  for (size_t i = 0; i < out.assigned.size(); ++i)
    rank.emplace(out.assigned[i].request.id, i + 1);
  auto key = [&](const de_placement& p) {
    auto i = rank.find(p.request_id);
    return i == rank.end() ? size_t{0} : i->second;
  };
  std::stable_sort(out.placed.begin(), out.placed.end(),
                   [&](const de_placement& a, const de_placement& b) {
                     return key(a) < key(b);
                   });
}

fetch_decision commit_assignment(cluster_state& st, const request_info& r,
                                 uint32_t pe, uint32_t group, read_mode reads) {
  const auto& pn = st.nodes[st.prefill[pe].node];
  const auto& dn = st.nodes[st.decode_groups[group].node];
  auto s = plan_reads(reads, pn.read_q, pn.read_tokens_per_s, dn.read_q,
                      dn.read_tokens_per_s, r.hit_blocks, r.block_tokens());
  commit_prefill(st, pe, r, 0);
  commit_reads(st, pe, group, r, s);
  route_to_group(st, group, r);
  return fetch_decision{r, pe, group, s};
}

dualpath_policy::dualpath_policy(policy_config cfg) : cfg_(cfg) {
}

fetch_result
dualpath_policy::fetch(cluster_state& st, std::deque<request_info>& waiting,
                       const std::vector<uint32_t>& pe_candidates) {
  fetch_result out;
  touched_.clear();
  if (st.decode_groups.empty())
    return out;
  while (!waiting.empty()) {
    const auto& r = waiting.front();
    auto pe = choose_prefill(st, pe_candidates, cfg_.limits);
    if (!pe)
      break; // FIFO: the head waits for the next fetch.
    auto g = choose_decode_group(st);
    out.assigned.push_back(commit_assignment(st, r, *pe, g, cfg_.reads));
    if (std::find(touched_.begin(), touched_.end(), g) == touched_.end())
      touched_.push_back(g);
    waiting.pop_front();
  }
  for (auto g : touched_) {
    auto p = place_in_group(st, g, cfg_.de_headroom);
    out.placed.insert(out.placed.end(), p.begin(), p.end());
  }
  order_placed_fifo(out);
  return out;
}

std::vector<de_placement> dualpath_policy::place(cluster_state& st,
                                                 uint32_t group) {
  return place_in_group(st, group, cfg_.de_headroom);
}

std::unique_ptr<placement_policy> make_policy(const policy_config& cfg) {
  if (cfg.kind == policy_kind::basic)
    return std::make_unique<round_robin_policy>(cfg);
  return std::make_unique<dualpath_policy>(cfg);
}

} // namespace dualpath::scheduler
