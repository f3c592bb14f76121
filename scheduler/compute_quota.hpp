// Intra-engine compute quota for a prefill engine (brief section 3): a request
// in a batch is (cached, bsz): `cached` tokens whose KV already exists (hits
// plus chunks prefilled earlier) and `bsz` new tokens computed now. Batches are
// packed FIFO while the predicted attention time stays within the quota
// (default 300 ms), so data-parallel GPUs spend equal attention time and none
// waits for another (no bubbles). The request that would overflow is cut: the
// largest bsz that still fits is found by binary search and the rest of it
// stays at the head of the queue, prefilled in later chunks.
//
// Guarantee (checked by the property tests): the predicted time of a packed
// batch is <= quota, except for one case: when even a chunk of min_chunk
// tokens (or the whole rest, if shorter) of the head request alone exceeds
// the quota, the batch is exactly that single chunk, so every call makes
// progress.
//
// Attention time comes from an attention_predictor: by default the FLOP model
// (attention_flop_model), replaceable by a profiled table (profiled_attention)
// or any callable. Predictors must be non-decreasing in bsz for a fixed cached
// count (binary search relies on it).
//
// Thread-safety: pure functions; predictors are immutable after construction.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

namespace dualpath::scheduler {

/// Predicted attention seconds for bsz new tokens over `cached` earlier tokens.
using attention_predictor =
    std::function<double(uint64_t cached, uint64_t bsz)>;

/// Default quota of the paper.
constexpr double default_compute_quota_s = 0.3;

/// Causal attention work: sum over the bsz new tokens of the context each one
/// attends to = bsz * cached + bsz (bsz + 1) / 2 (token-pairs).
double attention_pairs(uint64_t cached, uint64_t bsz);

/// FLOP model: per layer and token pair, QK^T costs 2 * heads * qk_head_dim
/// FLOPs and PV 2 * heads * v_head_dim; time = FLOPs / gpu_flops_per_s.
struct attention_flop_model {
  uint32_t layers = 61;
  uint32_t heads = 128;
  uint32_t qk_head_dim = 192;
  uint32_t v_head_dim = 128;
  double gpu_flops_per_s = 400e12; ///< Achieved attention FLOP/s.

  double flops(uint64_t cached, uint64_t bsz) const;
  double seconds(uint64_t cached, uint64_t bsz) const;
  attention_predictor predictor() const;
};

/// Profiled curve: measured (attention_pairs, seconds) points, interpolated
/// linearly in attention_pairs and extrapolated from the outermost segments
/// (clamped at 0). Points are sorted on construction; at least one needed.
class profiled_attention {
public:
  explicit profiled_attention(std::vector<std::pair<double, double>> points);

  double seconds(uint64_t cached, uint64_t bsz) const;
  attention_predictor predictor() const;

private:
  std::vector<std::pair<double, double>> points_;
};

/// A request waiting on a prefill engine: `remaining` tokens still to compute
/// on top of `cached` tokens.
struct prefill_item {
  uint64_t id = 0;
  uint64_t cached = 0;
  uint64_t remaining = 0;
};

/// One entry of a packed batch.
struct prefill_chunk {
  uint64_t id = 0;
  uint64_t cached = 0;
  uint64_t bsz = 0;
  double predicted_s = 0; ///< predictor(cached, bsz)
};

/// Packs one batch from the front of `queue` (see the guarantee above).
/// Whole requests are popped; a cut request stays at the head with cached +=
/// bsz and remaining -= bsz. Items with remaining == 0 are popped unbatched.
/// min_chunk >= 1.
std::vector<prefill_chunk> pack_batch(std::deque<prefill_item>& queue,
                                      const attention_predictor& predict,
                                      double quota_s = default_compute_quota_s,
                                      uint64_t min_chunk = 1);

} // namespace dualpath::scheduler
