#include "config/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"
#include "config/enum_names.hpp"

namespace dualpath::config {

constexpr std::string_view config_errc_names[] = {
    "none",         "unknown_key",     "wrong_type",
    "out_of_range", "invalid_choice",  "missing_file",
    "parse_error",  "unknown_profile", "malformed_override"};

std::string to_string(config_errc x) {
  return config::name_of(x, config_errc_names, "config_errc");
}

std::string message_of(const caf::error& err) {
  return config::error_message<config_errc>(err, caf::atom("dp_config"));
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<config_errc>(cfg, caf::atom("dp_config"),
                                          "config");
}

} // namespace dualpath::config
