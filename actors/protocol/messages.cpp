#include "actors/protocol/messages.hpp"

#include "config/enum_names.hpp"

namespace dualpath::actors {

constexpr std::string_view engine_role_names[] = {"prefill", "decode"};

std::string to_string(engine_role x) {
  return config::name_of(x, engine_role_names, "engine_role");
}

} // namespace dualpath::actors
