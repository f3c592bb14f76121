// Paper's prefill-engine (PE) selection for one request (brief section 3):
// among the candidate engines, exclude those with tok_e > beta (overloaded);
// prefer the short-queue class (the engine's node has read_q <= alpha), else
// the long-queue class (read_q > alpha); inside the class take min tok_e
// (ties: the earlier candidate). The fetch loop (policy.hpp) calls
// choose_prefill for the head of the waiting queue and stops the fetch when it
// returns no engine, so the waiting queue stays FIFO.
//
// Pure functions over cluster_state; no allocation; thread-safe for distinct
// states. Cost: one pass over the candidates (a few ns per engine).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/cluster_state.hpp"
#include "scheduler/thresholds.hpp"

namespace dualpath::scheduler {

/// The engine (index into st.prefill) the head request goes to, or nullopt
/// when every candidate is overloaded (or there is none).
std::optional<uint32_t> choose_prefill(const cluster_state& st,
                                       const std::vector<uint32_t>& candidates,
                                       const thresholds& th);

/// Records that `pe` took request `r` and that its node will read
/// `pe_side_read_tokens` of r's hit tokens: tok_e += len(r), seq_e += 1,
/// read_q of the PE's node += pe_side_read_tokens.
void commit_prefill(cluster_state& st, uint32_t pe, const request_info& r,
                    uint64_t pe_side_read_tokens);

} // namespace dualpath::scheduler
