// Hardware emulation shared by the actors of an emulated cluster: a time scale
// (emulated seconds per wall second of the actor clock), a byte scale (nominal
// KV bytes per real byte moved), and paced links (storage NICs, compute NICs,
// DRAM) that serialise nominal bytes at configured rates in emulated time.
//
// Time: every actor reads "now" from its actor clock (self->clock().now()),
// which is real time normally and simulated time under
// caf::scheduler::test_coordinator. emulated_time maps between the actor clock
// and emulated time: emulated = start + (actor_now - start) * time_scale, and
// an emulated duration d is waited for as d / time_scale on the actor clock.
//
// Thread safety: emulated_time is an immutable value; emulated_link is safe to
// share between the actors of one node (link_pacer holds a mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/link_pacer.hpp"

namespace dualpath::actors {

/// Maps between the actor clock and emulated time.
class emulated_time {
public:
  using clock_type = std::chrono::steady_clock;
  using time_point = clock_type::time_point;
  using duration = clock_type::duration;

  emulated_time() = default;

  /// `start` is the actor-clock time at which emulated time starts (both
  /// timelines coincide there); `time_scale` > 0.
  emulated_time(time_point start, double time_scale);

  /// The emulated time at actor-clock time `actor_now`.
  time_point to_emulated(time_point actor_now) const;

  /// The actor-clock delay that lasts `emulated` of emulated time (rounded up,
  /// never negative).
  duration to_actor(duration emulated) const;

  /// Emulated nanoseconds since the start.
  int64_t since_start_ns(time_point actor_now) const;

  double scale() const {
    return scale_;
  }
  time_point start() const {
    return start_;
  }

private:
  time_point start_{};
  double scale_ = 1.0;
};

/// Converts nominal bytes to the real bytes moved for them (ceil division,
/// at least 1 byte when nominal > 0).
uint64_t real_bytes(uint64_t nominal, uint32_t byte_scale);

/// A paced link in emulated time: reserve(nominal bytes, emulated now) returns
/// the emulated time point when the transfer completes.
class emulated_link {
public:
  /// `bytes_per_second` nominal (0 = unpaced); `name` for reports.
  emulated_link(std::string name, uint64_t bytes_per_second);

  emulated_time::time_point reserve(uint64_t nominal_bytes,
                                    emulated_time::time_point emulated_now) {
    return pacer_.reserve(nominal_bytes, emulated_now);
  }

  const std::string& name() const {
    return name_;
  }

  uint64_t rate() const {
    return pacer_.rate();
  }

  /// Nominal bytes moved over the link so far.
  uint64_t bytes() const {
    return pacer_.reserved_bytes();
  }

private:
  std::string name_;
  transport::link_pacer pacer_;
};

using link_ptr = std::shared_ptr<emulated_link>;

} // namespace dualpath::actors
