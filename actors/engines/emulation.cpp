#include "actors/engines/emulation.hpp"

#include <cmath>

namespace dualpath::actors {

emulated_time::emulated_time(time_point start, double time_scale)
    : start_(start), scale_(time_scale > 0 ? time_scale : 1.0) {
  // nop
}

emulated_time::time_point
emulated_time::to_emulated(time_point actor_now) const {
  auto elapsed = actor_now - start_;
  auto scaled = std::chrono::duration<double, std::nano>(elapsed) * scale_;
  return start_ + std::chrono::duration_cast<duration>(scaled);
}

emulated_time::duration emulated_time::to_actor(duration emulated) const {
  if (emulated.count() <= 0)
    return duration{0};
  auto ns = std::ceil(
      static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(emulated)
              .count())
      / scale_);
  return std::chrono::duration_cast<duration>(
      std::chrono::nanoseconds(static_cast<int64_t>(ns)));
}

int64_t emulated_time::since_start_ns(time_point actor_now) const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             to_emulated(actor_now) - start_)
      .count();
}

uint64_t real_bytes(uint64_t nominal, uint32_t byte_scale) {
  if (nominal == 0)
    return 0;
  if (byte_scale <= 1)
    return nominal;
  return (nominal + byte_scale - 1) / byte_scale;
}

emulated_link::emulated_link(std::string name, uint64_t bytes_per_second)
    : name_(std::move(name)), pacer_(bytes_per_second) {
  // nop
}

} // namespace dualpath::actors
