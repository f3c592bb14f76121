// Paper's decode-engine (DE) selection, two levels (brief section 3):
//  1. route_decode_group: across groups, a request goes to the group with the
//     least total tokens (tok_e of its engines plus requests routed to it and
//     not yet placed; ties: lower group index). It joins that group's pending
//     queue. This fixes the DE node, which is all the read path and the PE's
//     KV transfer (into the DE node's DRAM buffer) need.
//  2. place_in_group: inside one group, R = the longest FIFO prefix of the
//     pending queue whose decode HBM fits in the group's total free HBM (no
//     fragmentation assumed); Z = headroom x (sum len(R) + sum tok_e) / |E|.
//     For the head request, among the group's engines with enough free HBM,
//     prefer tok_e + len(r) <= Z and take min seq_e (ties: min tok_e, then
//     lower index); else take min tok_e; if no engine has room, stop (the head
//     waits for HBM: the group's queue stays FIFO). Placing r moves len(r)
//     from R to tok_e, so Z is constant during one call.
// A placed request costs its engine decode_hbm_bytes() of free HBM, so no DE
// is ever placed over its reported free memory.
//
// Pure functions over cluster_state; thread-safe for distinct states.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/cluster_state.hpp"

namespace dualpath::scheduler {

/// The paper's Z headroom factor.
constexpr double default_de_headroom = 1.05;

/// One request placed on one decode engine.
struct de_placement {
  uint64_t request_id = 0;
  uint32_t decode = 0; ///< Index into cluster_state::decode.
};

/// Level 1: the group (index into st.decode_groups) with the least total
/// tokens. Precondition: at least one decode group.
uint32_t choose_decode_group(const cluster_state& st);

/// Level 1 commit: appends r to the group's pending queue and adds len(r) to
/// the group's total tokens.
void route_to_group(cluster_state& st, uint32_t group, const request_info& r);

/// Level 2: places pending requests of `group` on its engines while the head
/// fits (updating tok_e, seq_e and free HBM); returns them in FIFO order.
std::vector<de_placement> place_in_group(cluster_state& st, uint32_t group,
                                         double headroom = default_de_headroom);

/// Level 2 for the head request alone, without changing anything: the engine
/// it would go to given threshold z, or UINT32_MAX when none has room.
uint32_t choose_decode_engine(const cluster_state& st, uint32_t group,
                              const request_info& r, double z);

/// Z for the group's current pending queue (see above).
double decode_threshold(const cluster_state& st, uint32_t group,
                        double headroom = default_de_headroom);

} // namespace dualpath::scheduler
