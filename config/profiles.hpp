// Named profiles: a named set of values for the keys of one section
// (hardware, model, workload), selected by `<section>.profile`. Values come
// from the brief (paper testbed, model configs, Table 2 of the paper);
// anything not in the paper is marked as an assumption in its description.
//
// Thread safety: profiles() is built once (thread-safe static), immutable.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/value.hpp"

namespace dualpath::config {

/// One named profile of one section.
struct profile {
  std::string section;     ///< "hardware", "model" or "workload".
  std::string name;        ///< "paper-hopper", "ds-660b", ...
  std::string description; ///< Where the numbers come from.
  /// Full key names ("model.layers") and their values, schema order.
  std::vector<std::pair<std::string, value>> values;
};

/// Every profile.
const std::vector<profile>& profiles();

/// The profile `name` of `section`, or nullptr.
const profile* find_profile(const std::string& section,
                            const std::string& name);

/// The names of the profiles of `section`, in table order.
std::vector<std::string> profile_names(const std::string& section);

} // namespace dualpath::config
