#include "config/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"

namespace dualpath::config {

std::string to_string(config_errc x) {
  switch (x) {
    case config_errc::none:
      return "none";
    case config_errc::unknown_key:
      return "unknown_key";
    case config_errc::wrong_type:
      return "wrong_type";
    case config_errc::out_of_range:
      return "out_of_range";
    case config_errc::invalid_choice:
      return "invalid_choice";
    case config_errc::missing_file:
      return "missing_file";
    case config_errc::parse_error:
      return "parse_error";
    case config_errc::unknown_profile:
      return "unknown_profile";
    case config_errc::malformed_override:
      return "malformed_override";
  }
  return "config_errc(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string message_of(const caf::error& err) {
  auto& ctx = err.context();
  if (!ctx.empty() && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  if (err.category() == caf::atom("dp_config"))
    return to_string(static_cast<config_errc>(err.code()));
  return caf::to_string(err);
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<config_errc>(cfg, caf::atom("dp_config"),
                                          "config");
}

} // namespace dualpath::config
