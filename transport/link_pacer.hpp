// link_pacer: the pacing arithmetic of one emulated network link (a storage
// NIC or a compute NIC). Transfers that share the link are serialised: each
// reservation of `bytes` starts when the link is free (or at `now`, whichever
// is later) and lasts bytes / rate. The pacer never reads a clock: callers pass
// "now" (an actor passes self->clock().now(), so pacing follows simulated time
// under caf::scheduler::test_coordinator) and wait until the returned time
// point themselves (with a delayed message, never by sleeping in an actor).
//
// Thread safety: all member functions may be called concurrently (one mutex).
// Ownership: a plain value object; share it (e.g. via shared_ptr) between the
// users of one link, such as a storage reader's read and write paths.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace dualpath::transport {

class link_pacer {
public:
  using clock_type = std::chrono::steady_clock;
  using time_point = clock_type::time_point;
  using duration = clock_type::duration;

  /// A link of `bytes_per_second`; 0 means unpaced (every transfer may
  /// complete at once).
  explicit link_pacer(uint64_t bytes_per_second = 0);

  link_pacer(const link_pacer&) = delete;
  link_pacer& operator=(const link_pacer&) = delete;

  /// Reserves the link for `bytes` and returns the time point at which the
  /// transfer may complete: max(now, end of the previous reservation) plus
  /// bytes / rate. Returns `now` when unpaced. Rounding remainders carry over
  /// between reservations, so long runs hold the rate exactly.
  time_point reserve(uint64_t bytes, time_point now);

  /// When the link becomes idle given the reservations so far (the epoch when
  /// nothing was reserved yet).
  time_point busy_until() const;

  /// The configured rate in bytes per second (0 = unpaced).
  uint64_t rate() const {
    return rate_;
  }

  /// Changes the rate for later reservations (0 = unpaced).
  void set_rate(uint64_t bytes_per_second);

  /// Total bytes reserved so far.
  uint64_t reserved_bytes() const;

private:
  mutable std::mutex mtx_;
  uint64_t rate_;
  time_point next_free_{};
  // Remainder (bytes * 1e9 mod rate) not yet turned into whole nanoseconds.
  uint64_t carry_ = 0;
  uint64_t reserved_ = 0;
};

} // namespace dualpath::transport
