// Errors of configuration loading as CAF error codes. Every error carries one
// human-readable message (the error's context) naming the key, the value and
// what is allowed; commands print it and exit with status 2.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace dualpath::config {

/// Why a configuration could not be loaded.
enum class config_errc : uint8_t {
  /// Not an error.
  none = 0,
  /// A key that is not in the schema (message suggests the closest key).
  unknown_key,
  /// A value of the wrong type (a string for an integer key, ...).
  wrong_type,
  /// A number outside the key's allowed range (negative bandwidth, ...).
  out_of_range,
  /// A string that is not one of the key's allowed choices.
  invalid_choice,
  /// The configuration file does not exist or cannot be read.
  missing_file,
  /// The configuration file is not valid TOML.
  parse_error,
  /// A `<section>.profile` value that names no profile of that section.
  unknown_profile,
  /// A command-line override that is not of the form key=value.
  malformed_override,
};

std::string to_string(config_errc x);

/// The message of a configuration error (its context string), or the
/// rendered code for errors without one.
std::string message_of(const caf::error& err);

/// Registers the error category with an actor system config so that
/// `actor_system::render` prints the code's name and message.
void add_error_category(caf::actor_system_config& cfg);

} // namespace dualpath::config

CAF_ERROR_CODE_ENUM(dualpath::config::config_errc, "dp_config")
