// What the tcp backend's sender and receiver share: the settings, the table
// of registered regions incoming writes land in, the counters and the
// handler of incoming immediates.
//
// Thread safety: `opts` is immutable after construction; every member
// function is thread-safe. Counters and the handler are read and updated
// without a lock, so a kv thread at the lowest CPU priority that is
// preempted mid-update never holds up a control thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

/// clock_type's now in nanoseconds since its epoch.
inline int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             clock_type::now().time_since_epoch())
      .count();
}

/// The `counters` of backend.hpp as atomics (same fields, same meaning).
struct tcp_counters {
  using value = std::atomic<uint64_t>;
  value batches_posted{0};
  value batches_completed{0};
  value batches_failed{0};
  value bytes_sent[traffic_class_count] = {};
  value bytes_received{0};
  value contended_bytes[traffic_class_count] = {};
  value rejected_unknown_region{0};
  value rejected_wrong_key{0};
  value rejected_out_of_bounds{0};
  value rejected_bad_frame{0};
  value rejected_unauthenticated{0};
  value dropped_half_open{0};
  value deadline_exceeded{0};
  value peer_lost{0};
  value connections_accepted{0};
  value connects{0};
  value kv_spin_hits{0};
  value kv_sleeps{0};
  value kv_yield_calls{0};

  counters snapshot() const {
    counters s;
    s.batches_posted = batches_posted;
    s.batches_completed = batches_completed;
    s.batches_failed = batches_failed;
    for (size_t c = 0; c < traffic_class_count; ++c) {
      s.bytes_sent[c] = bytes_sent[c];
      s.contended_bytes[c] = contended_bytes[c];
    }
    s.bytes_received = bytes_received;
    s.rejected_unknown_region = rejected_unknown_region;
    s.rejected_wrong_key = rejected_wrong_key;
    s.rejected_out_of_bounds = rejected_out_of_bounds;
    s.rejected_bad_frame = rejected_bad_frame;
    s.rejected_unauthenticated = rejected_unauthenticated;
    s.dropped_half_open = dropped_half_open;
    s.deadline_exceeded = deadline_exceeded;
    s.peer_lost = peer_lost;
    s.connections_accepted = connections_accepted;
    s.connects = connects;
    s.kv_spin_hits = kv_spin_hits;
    s.kv_sleeps = kv_sleeps;
    s.kv_yield_calls = kv_yield_calls;
    return s;
  }
};

class tcp_context {
public:
  explicit tcp_context(const options& o) : opts(o) {
    // nop
  }

  const options opts;
  region_table regions;
  tcp_counters stats;

  void on_immediate(immediate_handler f) {
    std::atomic_store(&handler_,
                      std::make_shared<const immediate_handler>(std::move(f)));
  }

  /// Calls the handler (outside any lock of ours).
  void signal_immediate(const incoming_immediate& x) const {
    auto f = std::atomic_load(&handler_);
    if (f && *f)
      (*f)(x);
  }

  /// Records control-class traffic (a write posted, a frame received) at
  /// `now_ns` (clock_type, nanoseconds since its epoch): kv system calls
  /// stay short for `tcp_kv_yield_ms` after it (syscall_chunk).
  void note_control(int64_t now_ns) {
    last_control_ns_.store(now_ns, std::memory_order_relaxed);
  }

  /// When control-class traffic was last recorded (INT64_MIN: never).
  int64_t last_control_ns() const {
    return last_control_ns_.load(std::memory_order_relaxed);
  }

private:
  std::atomic<int64_t> last_control_ns_{INT64_MIN};
  std::shared_ptr<const immediate_handler> handler_;
};

} // namespace dualpath::transport::bulk
