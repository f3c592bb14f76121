#include "scheduler/compute_quota.hpp"

#include <algorithm>

namespace dualpath::scheduler {

double attention_pairs(uint64_t cached, uint64_t bsz) {
  auto b = static_cast<double>(bsz);
  return b * static_cast<double>(cached) + b * (b + 1) / 2;
}

double attention_flop_model::flops(uint64_t cached, uint64_t bsz) const {
  return 2.0 * layers * heads * (static_cast<double>(qk_head_dim) + v_head_dim)
         * attention_pairs(cached, bsz);
}

double attention_flop_model::seconds(uint64_t cached, uint64_t bsz) const {
  return flops(cached, bsz) / gpu_flops_per_s;
}

attention_predictor attention_flop_model::predictor() const {
  auto self = *this;
  return [self](uint64_t c, uint64_t b) { return self.seconds(c, b); };
}

profiled_attention::profiled_attention(
    std::vector<std::pair<double, double>> points)
    : points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
}

double profiled_attention::seconds(uint64_t cached, uint64_t bsz) const {
  if (points_.empty())
    return 0;
  if (points_.size() == 1)
    return points_[0].second;
  auto x = attention_pairs(cached, bsz);
  // Segment [i-1, i] containing x; outermost segments extrapolate.
  auto it = std::lower_bound(points_.begin(), points_.end(),
                             std::make_pair(x, -1e300));
  size_t i = static_cast<size_t>(it - points_.begin());
  i = std::clamp<size_t>(i, 1, points_.size() - 1);
  const auto& a = points_[i - 1];
  const auto& b = points_[i];
  double y = a.second;
  if (b.first > a.first)
    y = a.second + (x - a.first) * (b.second - a.second) / (b.first - a.first);
  return std::max(0.0, y);
}

attention_predictor profiled_attention::predictor() const {
  auto self = *this;
  return [self](uint64_t c, uint64_t b) { return self.seconds(c, b); };
}

std::vector<prefill_chunk> pack_batch(std::deque<prefill_item>& queue,
                                      const attention_predictor& predict,
                                      double quota_s, uint64_t min_chunk) {
  std::vector<prefill_chunk> out;
  min_chunk = std::max<uint64_t>(min_chunk, 1);
  double total = 0;
  while (!queue.empty()) {
    auto& head = queue.front();
    if (head.remaining == 0) {
      queue.pop_front();
      continue;
    }
    double whole = predict(head.cached, head.remaining);
    if (total + whole <= quota_s) {
      total += whole;
      out.push_back(prefill_chunk{head.id, head.cached, head.remaining, whole});
      queue.pop_front();
      continue;
    }
    // Overflow: the largest bsz in [min, remaining) that still fits.
    uint64_t lo = std::min(min_chunk, head.remaining);
    uint64_t best = 0;
    uint64_t hi = head.remaining - 1;
    while (lo <= hi && hi > 0) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (total + predict(head.cached, mid) <= quota_s) {
        best = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (best == 0 && out.empty()) {
      // Not even a minimal chunk fits an empty batch: run it alone.
      best = std::min(min_chunk, head.remaining);
    }
    if (best > 0) {
      double t = predict(head.cached, best);
      out.push_back(prefill_chunk{head.id, head.cached, best, t});
      if (best == head.remaining) {
        queue.pop_front();
      } else {
        head.cached += best;
        head.remaining -= best;
      }
    }
    break;
  }
  return out;
}

} // namespace dualpath::scheduler
