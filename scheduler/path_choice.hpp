// Which side reads a request's hit blocks from storage (brief section 3):
//  - shorter_queue (the paper): all hit blocks on the side, PE node or DE
//    node, whose read queue (tokens) is shorter; a tie goes to the PE side,
//    whose reads feed the prefill directly;
//  - split (beyond the paper, where it is future work): blocks [0, k) on the
//    PE side and [k, hit_blocks) on the DE side, with k chosen so that both
//    queues are expected to drain at the same time: k minimises
//    max((q_pe + k T) / rate_pe, (q_de + (H - k) T) / rate_de) over integers
//    0..H (T = tokens per block); the continuous optimum is
//    k* = (rate_pe (q_de + H T) - rate_de q_pe) / (T (rate_pe + rate_de)),
//    and the better of floor/ceil (ties: more on the PE side) is taken;
//  - pe_only (Basic mode): every hit block on the PE side.
// The result uses the contiguous form of actors::read_plan: the PE reads
// blocks [0, pe_side_blocks), the DE the rest, so the parts always cover the
// hit blocks exactly once.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace dualpath::scheduler {

/// How a policy assigns reads to the two paths.
enum class read_mode : uint8_t {
  pe_only = 0,       ///< Basic: the prefill node reads everything.
  shorter_queue = 1, ///< The paper: the side with the shorter queue.
  split = 2,         ///< Divide the blocks so both queues drain together.
};

std::string to_string(read_mode x);

/// Mirrors actors::read_plan (kept CAF-free here).
struct read_split {
  uint32_t hit_blocks = 0;     ///< Leading Full Blocks found in storage.
  uint32_t pe_side_blocks = 0; ///< The PE reads [0, pe_side_blocks).

  uint32_t de_side_blocks() const {
    return hit_blocks - pe_side_blocks;
  }
};

/// The paper's path choice: everything on the side with the shorter queue.
read_split choose_path(uint64_t pe_read_q, uint64_t de_read_q,
                       uint32_t hit_blocks);

/// Split reads: see above. Rates in tokens/s (> 0), queues in tokens.
read_split split_reads(uint64_t pe_read_q, double pe_rate, uint64_t de_read_q,
                       double de_rate, uint32_t hit_blocks,
                       uint32_t block_tokens);

/// Dispatches on mode.
read_split plan_reads(read_mode mode, uint64_t pe_read_q, double pe_rate,
                      uint64_t de_read_q, double de_rate, uint32_t hit_blocks,
                      uint32_t block_tokens);

} // namespace dualpath::scheduler
