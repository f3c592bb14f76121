#include "actors/engines/prefill/packing.hpp"

#include <algorithm>
#include <deque>

namespace dualpath::actors {

namespace {

uint64_t resident(const pack_limits& lim, uint64_t cached, uint64_t bsz) {
  return uint64_t{lim.resident_layers} * (cached + bsz) * lim.bpt;
}

} // namespace

packed_batch pack_gpu_batch(const std::vector<pack_candidate>& ready,
                            const pack_limits& lim,
                            const scheduler::attention_predictor& predict) {
  packed_batch out;
  if (ready.empty())
    return out;
  // What the compute rule alone packs.
  std::vector<scheduler::prefill_chunk> wanted;
  if (lim.policy == batching::quota) {
    std::deque<scheduler::prefill_item> queue;
    for (auto& c : ready)
      queue.push_back(scheduler::prefill_item{c.id, c.cached, c.remaining});
    wanted = scheduler::pack_batch(queue, predict, lim.quota_s, lim.min_chunk);
  } else {
    uint64_t left = std::max<uint64_t>(lim.batch_tokens, 1);
    for (auto& c : ready) {
      if (left == 0)
        break;
      auto bsz = std::min(c.remaining, left);
      if (bsz == 0)
        continue;
      wanted.push_back(scheduler::prefill_chunk{c.id, c.cached, bsz, 0});
      left -= bsz;
    }
  }
  // The HBM rule: stop before the first chunk that does not fit; cut a first
  // chunk to what fits.
  uint64_t used = 0;
  for (auto& ch : wanted) {
    auto need = resident(lim, ch.cached, ch.bsz);
    if (used + need <= lim.hbm_bytes) {
      used += need;
      out.chunks.push_back(ch);
      continue;
    }
    if (out.chunks.empty()) {
      auto base = resident(lim, ch.cached, 0);
      auto per_token = uint64_t{lim.resident_layers} * lim.bpt;
      if (base + per_token > lim.hbm_bytes || per_token == 0) {
        out.unfit = ch.id;
        return out;
      }
      ch.bsz = std::min(ch.bsz, (lim.hbm_bytes - base) / per_token);
      ch.predicted_s =
          lim.policy == batching::quota ? predict(ch.cached, ch.bsz) : 0;
      out.chunks.push_back(ch);
    }
    break;
  }
  return out;
}

} // namespace dualpath::actors
