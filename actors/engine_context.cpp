#include "actors/engine_context.hpp"

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

} // namespace dualpath::actors
