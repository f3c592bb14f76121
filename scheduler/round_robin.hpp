// Basic mode's placement policy (the paper's Basic baseline: no adaptive
// scheduler, PE-only reads), behind the same interface as dualpath_policy so
// the scheduler actor swaps them by config:
//  - prefill: the next candidate in round-robin order, skipping engines with
//    tok_e > beta (so a fetch cannot hoard the whole waiting queue on full
//    engines); stop the fetch when every candidate is over beta;
//  - decode group: the next group in round-robin order;
//  - decode engine: the group's next engine in round-robin order that has
//    enough free HBM; stop when none has;
//  - reads: as cfg.reads says; policy_config::basic() puts every hit block on
//    the PE side (Basic), other modes give the ablation's "round robin with
//    dual-path reads".
// Loads are still recorded in cluster_state (tok_e, seq_e, free HBM, read
// queues), so both policies are compared on the same bookkeeping.
//
// Thread-safety: one owner at a time (cursors). Ownership: holds config and
// cursors only.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/policy.hpp"

namespace dualpath::scheduler {

class round_robin_policy final : public placement_policy {
public:
  explicit round_robin_policy(policy_config cfg);

  fetch_result fetch(cluster_state& st, std::deque<request_info>& waiting,
                     const std::vector<uint32_t>& pe_candidates) override;

  std::vector<de_placement> place(cluster_state& st, uint32_t group) override;

private:
  policy_config cfg_;
  uint64_t pe_cursor_ = 0;
  uint32_t group_cursor_ = 0;
  std::vector<uint32_t> engine_cursor_; // per decode group
  std::vector<uint32_t> touched_;
};

} // namespace dualpath::scheduler
