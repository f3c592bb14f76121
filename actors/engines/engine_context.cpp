#include "actors/engines/engine_context.hpp"

#include <cmath>

#include <caf/actor_system.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/emulation.hpp"
#include "config/enum_names.hpp"

namespace dualpath::actors {

constexpr std::string_view load_mode_names[] = {"basic", "layerwise",
                                                "dualpath", "oracle"};

std::string to_string(load_mode x) {
  return config::name_of(x, load_mode_names, "load_mode");
}

bool from_string(const std::string& str, load_mode& x) {
  return config::parse_name(str, load_mode_names, x);
}

constexpr std::string_view batching_names[] = {"quota", "token_budget"};

std::string to_string(batching x) {
  return config::name_of(x, batching_names, "batching");
}

model_shape coarsen(const model_shape& m, uint32_t k, uint32_t byte_scale) {
  if (k <= 1 || m.layers == 0)
    return m;
  auto out = m;
  out.layers = (m.layers + k - 1) / k;
  out.layer_weight =
      m.layer_weight * static_cast<double>(m.layers) / out.layers;
  auto w = static_cast<double>(m.layers) / out.layers;
  out.nominal_bytes_per_token_layer = static_cast<uint64_t>(
      std::llround(static_cast<double>(m.nominal_bytes_per_token_layer) * w));
  out.real_bytes_per_token_layer =
      real_bytes(out.nominal_bytes_per_token_layer, byte_scale);
  return out;
}

bool waits_for_device_in_place(caf::actor_system& sys) {
  return dynamic_cast<caf::scheduler::test_coordinator*>(&sys.scheduler())
         != nullptr;
}

} // namespace dualpath::actors
