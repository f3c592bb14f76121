// Weighted round robin by bytes between traffic classes: the sender asks the
// arbiter which eligible class sends next and reports the bytes it sent; over
// any interval in which both classes stay eligible their byte shares follow
// the weights (within one grant). A class that was idle gets no saved-up
// credit when it returns (its count is lifted to its fair share).
//
// Thread safety: none (owned by one sender thread).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "transport/types.hpp"

namespace dualpath::transport::bulk {

class wrr_arbiter {
public:
  wrr_arbiter(uint32_t weight_control, uint32_t weight_kv)
      : weights_{weight_control == 0 ? 1 : weight_control,
                 weight_kv == 0 ? 1 : weight_kv} {
    // nop
  }

  /// The class to serve among `eligible` (indexed by traffic_class); -1 if
  /// none is eligible.
  int pick(const std::array<bool, traffic_class_count>& eligible) {
    // Lift classes that just became eligible to the current virtual time so
    // idleness is not banked as credit.
    double vt = -1;
    for (size_t c = 0; c < traffic_class_count; ++c)
      if (eligible[c] && was_eligible_[c])
        vt = vt < 0 ? norm(c) : std::min(vt, norm(c));
    for (size_t c = 0; c < traffic_class_count; ++c) {
      if (eligible[c] && !was_eligible_[c] && vt >= 0 && norm(c) < vt)
        sent_[c] = static_cast<uint64_t>(vt * weights_[c]);
      was_eligible_[c] = eligible[c];
    }
    int best = -1;
    for (size_t c = 0; c < traffic_class_count; ++c)
      if (eligible[c] && (best < 0 || norm(c) < norm(best)))
        best = static_cast<int>(c);
    return best;
  }

  /// Accounts `bytes` sent by class `c`.
  void charge(int c, uint64_t bytes) {
    sent_[c] += bytes;
  }

private:
  double norm(size_t c) const {
    return static_cast<double>(sent_[c]) / weights_[c];
  }
  std::array<uint64_t, traffic_class_count> weights_;
  std::array<uint64_t, traffic_class_count> sent_{};
  std::array<bool, traffic_class_count> was_eligible_{};
};

} // namespace dualpath::transport::bulk
