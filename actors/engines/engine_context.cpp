#include "actors/engines/engine_context.hpp"

#include <cmath>

#include <caf/actor_system.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/emulation.hpp"

namespace dualpath::actors {

std::string to_string(load_mode x) {
  switch (x) {
    case load_mode::basic:
      return "basic";
    case load_mode::layerwise:
      return "layerwise";
    case load_mode::dualpath:
      return "dualpath";
    case load_mode::oracle:
      return "oracle";
  }
  return "load_mode(" + std::to_string(static_cast<int>(x)) + ")";
}

bool from_string(const std::string& str, load_mode& x) {
  for (auto m : {load_mode::basic, load_mode::layerwise, load_mode::dualpath,
                 load_mode::oracle}) {
    if (to_string(m) == str) {
      x = m;
      return true;
    }
  }
  return false;
}

std::string to_string(batching x) {
  switch (x) {
    case batching::quota:
      return "quota";
    case batching::token_budget:
      return "token_budget";
  }
  return "batching(" + std::to_string(static_cast<int>(x)) + ")";
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
