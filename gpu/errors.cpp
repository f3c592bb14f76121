#include "gpu/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"
#include "config/enum_names.hpp"

namespace dualpath::gpu {

constexpr std::string_view gpu_errc_names[] = {
    "none",          "no_device",      "budget_exceeded",  "out_of_memory",
    "out_of_bounds", "invalid_handle", "invalid_argument", "unsupported",
    "cuda_error",    "system_error",   "driver_error",     "driver_too_old"};

std::string to_string(gpu_errc x) {
  return config::name_of(x, gpu_errc_names, "gpu_errc");
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<gpu_errc>(cfg, caf::atom("dp_gpu"), "gpu");
}

} // namespace dualpath::gpu
