// How one prefill GPU packs the batch of its next step (pure functions; the
// prefill engine calls them for every GPU at every step, the tests directly).
//
// Candidates are the GPU's ready requests in FIFO order, each (cached,
// remaining): `cached` tokens whose KV exists (hits and chunks computed
// before), `remaining` tokens to compute.
//   batching::quota: scheduler::pack_batch under quota_s with the predicted
//     attention time (engine_timing.hpp attention_seconds): FIFO while the
//     batch's time fits, the request that overflows cut by binary search;
//   batching::token_budget: FIFO while the batch's new tokens fit
//     batch_tokens, the request that overflows cut to fill them.
// Either way the batch's resident KV, resident_layers x (cached + new) x
// bytes per token of every chunk, must fit hbm_bytes (Basic keeps every
// layer resident, layerwise only its window): the batch stops before the
// first chunk that would not fit, and a first chunk that does not fit is
// cut to what fits. A head request whose cached KV alone does not fit is
// reported (it can never run on this GPU).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/engines/engine_context.hpp"
#include "scheduler/compute_quota.hpp"

namespace dualpath::actors {

/// One ready request of a GPU.
struct pack_candidate {
  uint64_t id = 0;
  uint64_t cached = 0;
  uint64_t remaining = 0;
};

struct pack_limits {
  batching policy = batching::quota;
  double quota_s = 0.3;
  uint64_t batch_tokens = 16384;
  /// Bytes of HBM for KV the batch may fill (real bytes, as the staging).
  uint64_t hbm_bytes = 0;
  /// Layers resident at once (the window, or every layer for Basic).
  uint32_t resident_layers = 1;
  /// Real bytes per token per layer.
  uint64_t bpt = 1;
  /// The smallest chunk a quota-packed request is cut to.
  uint64_t min_chunk = 1;
};

struct packed_batch {
  std::vector<scheduler::prefill_chunk> chunks;
  /// A request at the head whose cached KV alone exceeds hbm_bytes (0:
  /// none); nothing is packed behind it.
  uint64_t unfit = 0;
};

/// Packs one GPU's next batch (see the file comment).
packed_batch pack_gpu_batch(const std::vector<pack_candidate>& ready,
                            const pack_limits& limits,
                            const scheduler::attention_predictor& predict);

} // namespace dualpath::actors
