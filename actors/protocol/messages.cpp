#include "actors/protocol/messages.hpp"

namespace dualpath::actors {

std::string to_string(engine_role x) {
  switch (x) {
    case engine_role::prefill:
      return "prefill";
    case engine_role::decode:
      return "decode";
  }
  return "engine_role(" + std::to_string(static_cast<int>(x)) + ")";
}

} // namespace dualpath::actors
