// Weighted round robin by bytes between the two traffic classes of one peer,
// shared by the per-class sender threads. Before each write a thread asks for
// a grant. While the other class does not contend (nothing queued, its socket
// full, or it has not asked for `stale` although ready: a thread starved of
// CPU never holds the other back) it gets a `lone` grant, uncharged
// (work-conserving; no credit is banked for idle or blocked periods). While
// both contend it gets a `quantum` if its weighted byte count leads the other
// by less than one quantum of its own, charged at once (so a thread slow to
// use its grant never holds the other back), and otherwise waits until the
// other class charges a grant or stops contending; the thread that makes the
// waiting one eligible is told to wake it. Over any interval in which both
// classes contend, their byte shares follow the weights within about one
// quantum each. A class that becomes ready again is lifted to the other's
// weighted count (no saved-up credit).
//
// Thread safety: lock-free (atomics), so a low-priority thread preempted in
// the middle of a call never blocks the other class's thread. Each class's
// calls come from one thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/types.hpp"

namespace dualpath::transport::bulk {

class shared_wrr {
  __extension__ using u128 = unsigned __int128;

public:
  using nanos = int64_t; ///< A monotonic time in nanoseconds.

  shared_wrr(uint32_t weight_control, uint32_t weight_kv,
             nanos stale = 1'000'000)
      : weights_{weight_control == 0 ? 1 : weight_control,
                 weight_kv == 0 ? 1 : weight_kv},
        stale_(stale) {
    // nop
  }

  /// What acquire() granted.
  struct grant {
    size_t bytes = 0;        ///< 0: wait to be woken (or retry later).
    bool contended = false;  ///< Charged; settle() what is not sent.
    bool wake_other = false; ///< The other class waited for this.
  };

  /// Class `c` has data and a writable socket (or not) at time `now`
  /// (becoming ready counts as asking). Returns true when the other class
  /// waited for this change: its thread must be woken.
  bool set_ready(size_t c, bool ready, nanos now) {
    if (ready)
      asked_[c].store(now);
    auto was = ready_[c].exchange(ready);
    if (ready == was)
      return false;
    if (ready) {
      lift(c);
      return false;
    }
    return waiting_[other(c)].exchange(false);
  }

  /// A grant for class `c` at time `now` (see file comment).
  grant acquire(size_t c, size_t quantum, size_t lone, nanos now) {
    auto o = other(c);
    asked_[c].store(now);
    if (!contends(o, now))
      return {lone, false, false};
    if (!behind(c, quantum)) {
      // Dekker-style: announce the wait, then look again, so a charge or
      // an un-ready of the other class in between is never missed.
      waiting_[c].store(true);
      if (contends(o, now) && !behind(c, quantum))
        return {0, false, false};
      waiting_[c].store(false);
      if (!contends(o, now))
        return {lone, false, false};
    }
    sent_[c].fetch_add(quantum);
    bool wake = behind(o, quantum) && waiting_[o].exchange(false);
    return {quantum, true, wake};
  }

  /// Returns the unused part of a contended grant of class `c`.
  void settle(size_t c, size_t granted, size_t used) {
    if (used < granted)
      sent_[c].fetch_sub(granted - used);
  }

  /// Bytes charged so far (tests).
  uint64_t charged(size_t c) const {
    return sent_[c].load();
  }

private:
  static size_t other(size_t c) {
    return c == 0 ? 1 : 0;
  }

  bool contends(size_t c, nanos now) const {
    return ready_[c].load() && now - asked_[c].load() < stale_;
  }

  /// sent[c]/w[c] < sent[o]/w[o] + quantum/w[c], without division; ties
  /// at zero lead go to control.
  bool behind(size_t c, size_t quantum) const {
    auto o = other(c);
    auto lhs = static_cast<u128>(sent_[c].load()) * weights_[o];
    auto rhs = static_cast<u128>(sent_[o].load()) * weights_[c]
               + static_cast<u128>(quantum) * weights_[o];
    return c == 0 ? lhs <= rhs : lhs < rhs;
  }

  void lift(size_t c) {
    auto o = other(c);
    if (!ready_[o].load())
      return;
    auto target = static_cast<uint64_t>(static_cast<u128>(sent_[o].load())
                                        * weights_[c] / weights_[o]);
    auto cur = sent_[c].load();
    while (cur < target && !sent_[c].compare_exchange_weak(cur, target)) {
      // cur reloaded
    }
  }

  std::array<uint64_t, traffic_class_count> weights_;
  nanos stale_;
  std::array<std::atomic<uint64_t>, traffic_class_count> sent_{};
  std::array<std::atomic<nanos>, traffic_class_count> asked_{};
  std::array<std::atomic<bool>, traffic_class_count> ready_{};
  std::array<std::atomic<bool>, traffic_class_count> waiting_{};
};

} // namespace dualpath::transport::bulk
