// A configuration value: one of the four types a key can have (bool, integer,
// real, string), and how it is written in TOML.
//
// Thread safety: plain value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

namespace dualpath::config {

/// The type of a configuration key.
enum class value_type : uint8_t {
  /// true or false.
  boolean,
  /// A signed 64-bit integer.
  integer,
  /// A double; TOML integers are accepted for real keys.
  real,
  /// A UTF-8 string.
  string,
};

std::string to_string(value_type x);

/// A configuration value; the alternative's index equals its value_type.
using value = std::variant<bool, int64_t, double, std::string>;

/// The type of the alternative `x` holds.
value_type type_of(const value& x);

/// `x` as a TOML value: true, 42, 400.0, 3.7e+10, "text" (escaped). Reals
/// always carry a '.' or an exponent so TOML reads them back as floats, and
/// round-trip exactly.
std::string to_toml(const value& x);

/// `x` for messages: like to_toml.
std::string to_string(const value& x);

/// A real written in its shortest round-tripping form ("0.5", "400", "1e-05").
std::string format_real(double x);

/// `str` as a TOML basic string literal, quotes included.
std::string toml_quote(const std::string& str);

} // namespace dualpath::config
