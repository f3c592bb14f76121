// The configuration schema: every key dualpath knows, with its type, default,
// unit, meaning and allowed values. The table is the single source of truth
// for validation, for `--print-config` and for config/reference.toml.
//
// The keys of each section live in their own file (config/keys_<section>.cpp)
// so a subsystem adds its keys without touching the others; schema.cpp lists
// the sections in order.
//
// Thread safety: schema() is built once on first use (thread-safe static) and
// immutable afterwards.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/value.hpp"

namespace dualpath::config {

/// Allowed numeric interval of an integer or real key (bounds inclusive
/// unless marked exclusive; absent bounds are unbounded).
struct range {
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;

  static range at_least(double lo) {
    return range{lo, std::nullopt, false};
  }
  static range above(double lo) {
    return range{lo, std::nullopt, true};
  }
  static range between(double lo, double hi) {
    return range{lo, hi, false};
  }
  static range above_at_most(double lo, double hi) {
    return range{lo, hi, true};
  }

  bool contains(double x) const;

  /// "> 0", ">= 1", "0 .. 15", "> 0 and <= 1", or "any".
  std::string describe() const;
};

/// One configuration key.
struct key_spec {
  std::string name;                 ///< "section.key".
  value_type type;                  ///< Type of its values.
  value default_value;              ///< Used when nothing else sets it.
  std::string unit;                 ///< "Gb/s", "tokens", ...; empty if none.
  std::string meaning;              ///< One or two sentences for humans.
  range limits;                     ///< For integer and real keys.
  std::vector<std::string> choices; ///< Allowed strings; empty = any.
  bool selects_profile = false;     ///< `<section>.profile`: picks a profile.

  std::string section() const;
  std::string short_name() const; ///< The part after the section.
  /// What is allowed, for messages: "an integer >= 1", "one of a, b".
  std::string allowed() const;
};

/// Every key, grouped by section in schema order.
const std::vector<key_spec>& schema();

/// The key named `name`, or nullptr.
const key_spec* find_key(std::string_view name);

/// The sections in schema order ("hardware", "model", ...).
std::vector<std::string> sections();

/// The known key closest to `name` by edit distance, or "" when none is close
/// enough to be a plausible typo.
std::string suggest_key(std::string_view name);

/// The word of `choices` closest to `word` by edit distance when it is a
/// plausible typo of it (at most a third of the word's length and at most 4
/// edits away), else "". For "did you mean" hints on flags, subcommands and
/// enumerated values.
std::string suggest(std::string_view word,
                    const std::vector<std::string>& choices);

/// Levenshtein distance between `x` and `y`.
size_t edit_distance(std::string_view x, std::string_view y);

} // namespace dualpath::config
