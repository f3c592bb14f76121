// The placement policy interface the scheduler actor drives, and the paper's
// policy behind it. The actor owns a cluster_state and the global waiting
// queue; when a prefill group's leader fetches it calls fetch() with the
// candidate prefill engines (the fetching group's engines, or every prefill
// engine), and when a decode group's leader reports it calls place(). Basic
// mode swaps in round_robin_policy (round_robin.hpp) through make_policy: same
// interface, chosen by config.
//
// fetch contract (every policy):
//  - assigns a FIFO prefix of `waiting` (popped from its front) and stops at
//    the first request it cannot assign, which stays at the head;
//  - each assigned request gets one prefill engine, one decode group and a
//    read split covering its hit blocks exactly once; it is routed to that
//    group's pending queue and the group's placement runs, so the result
//    also lists the requests that got a decode engine during this call;
//  - every request is returned exactly once in `assigned`, and later exactly
//    once in some `placed` (of this fetch or of a later place()).
// place contract: places pending requests of one decode group while its head
// fits; never over a DE's free HBM. A request needing more HBM than any DE of
// its group can ever free would wait forever: the actor rejects such requests
// at submission (compare decode_hbm_bytes() with the DEs' HBM capacity).
//
// Thread-safety: a policy object is used by one owner at a time (the
// round-robin policy keeps cursors). Ownership: policies hold only config and
// cursors; all load state lives in cluster_state.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/cluster_state.hpp"
#include "scheduler/de_selection.hpp"
#include "scheduler/path_choice.hpp"
#include "scheduler/thresholds.hpp"

namespace dualpath::scheduler {

/// Which placement policy runs.
enum class policy_kind : uint8_t {
  basic = 0,    ///< Round robin, PE-only reads (the paper's Basic baseline).
  dualpath = 1, ///< The paper's adaptive scheduler.
};

std::string to_string(policy_kind x);

/// Policy parameters (the config module fills this from config keys). Every
/// policy honours `reads`, so the ablation steps (round robin with dual-path
/// reads, the paper's scheduler without split reads) are configurations.
struct policy_config {
  policy_kind kind = policy_kind::dualpath;
  thresholds limits;                        ///< alpha, beta (tokens).
  double de_headroom = default_de_headroom; ///< Z factor.
  read_mode reads = read_mode::split;       ///< Which side reads hit blocks.

  /// The paper's Basic baseline: round robin, every read on the PE side.
  static policy_config basic(thresholds limits) {
    return policy_config{policy_kind::basic, limits, default_de_headroom,
                         read_mode::pe_only};
  }

  /// DualPath mode: the paper's scheduler, split reads unless told otherwise.
  static policy_config dualpath(thresholds limits,
                                read_mode reads = read_mode::split) {
    return policy_config{policy_kind::dualpath, limits, default_de_headroom,
                         reads};
  }
};

/// The decision for one request at fetch time.
struct fetch_decision {
  request_info request;
  uint32_t prefill = 0;      ///< Index into cluster_state::prefill.
  uint32_t decode_group = 0; ///< Index into cluster_state::decode_groups.
  read_split reads;          ///< PE side reads [0, pe_side_blocks).
};

/// What one fetch did.
struct fetch_result {
  std::vector<fetch_decision> assigned; ///< FIFO order.
  /// Decode placements made now, in FIFO order: requests assigned by earlier
  /// calls first, then this call's in the order of `assigned` (whatever
  /// group each went to). Engines start a request's reads in the order they
  /// receive it, so this order is the order the prefill node reads in.
  std::vector<de_placement> placed;
};

/// A placement policy (see the contract above).
class placement_policy {
public:
  virtual ~placement_policy();

  virtual fetch_result fetch(cluster_state& st,
                             std::deque<request_info>& waiting,
                             const std::vector<uint32_t>& pe_candidates) = 0;

  virtual std::vector<de_placement> place(cluster_state& st,
                                          uint32_t group) = 0;
};

/// The paper's policy: PE selection (pe_selection.hpp), DE routing and
/// placement (de_selection.hpp), reads by cfg.reads (path_choice.hpp).
/// Not the Basic baseline: that is round_robin_policy.
class dualpath_policy final : public placement_policy {
public:
  explicit dualpath_policy(policy_config cfg);

  fetch_result fetch(cluster_state& st, std::deque<request_info>& waiting,
                     const std::vector<uint32_t>& pe_candidates) override;

  std::vector<de_placement> place(cluster_state& st, uint32_t group) override;

  const policy_config& config() const {
    return cfg_;
  }

private:
  policy_config cfg_;
  std::vector<uint32_t> touched_; // scratch: groups routed to in one fetch
};

/// The policy named by cfg.kind.
std::unique_ptr<placement_policy> make_policy(const policy_config& cfg);

/// Applies a read split to the node queues: PE node += PE-side tokens, DE
/// group's node += DE-side tokens. Shared by the policies.
void commit_reads(cluster_state& st, uint32_t pe, uint32_t group,
                  const request_info& r, const read_split& s);

/// Orders out.placed as fetch_result documents (stable: placements of
/// earlier assignments keep their relative order). Shared by the policies,
/// which place group by group.
void order_placed_fifo(fetch_result& out);

/// Assigns `r` to prefill engine `pe` and decode group `group`: its reads
/// split by `reads` over the two nodes' queues (plan_reads), then the
/// prefill, the reads and the routing committed to `st`. Shared by the
/// policies; returns the decision for fetch_result::assigned.
fetch_decision commit_assignment(cluster_state& st, const request_info& r,
                                 uint32_t pe, uint32_t group, read_mode reads);

} // namespace dualpath::scheduler
