#include "gpu/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"

namespace dualpath::gpu {

std::string to_string(gpu_errc x) {
  switch (x) {
    case gpu_errc::none:
      return "none";
    case gpu_errc::no_device:
      return "no_device";
    case gpu_errc::driver_too_old:
      return "driver_too_old";
    case gpu_errc::budget_exceeded:
      return "budget_exceeded";
    case gpu_errc::out_of_memory:
      return "out_of_memory";
    case gpu_errc::out_of_bounds:
      return "out_of_bounds";
    case gpu_errc::invalid_handle:
      return "invalid_handle";
    case gpu_errc::invalid_argument:
      return "invalid_argument";
    case gpu_errc::unsupported:
      return "unsupported";
    case gpu_errc::cuda_error:
      return "cuda_error";
    case gpu_errc::system_error:
      return "system_error";
    case gpu_errc::driver_error:
      return "driver_error";
  }
  return "gpu_errc(" + std::to_string(static_cast<int>(x)) + ")";
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<gpu_errc>(cfg, caf::atom("dp_gpu"), "gpu");
}

} // namespace dualpath::gpu
