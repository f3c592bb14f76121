// Internal to config/: one function per section appends that section's keys
// to the schema (defined in config/keys_<section>.cpp, listed in schema.cpp),
// each key one call of a section_keys builder: name, default, unit and
// allowed range on the first line, the meaning after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/schema.hpp"

namespace dualpath::config::keys {

void add_hardware(std::vector<key_spec>& out);
void add_model(std::vector<key_spec>& out);
void add_workload(std::vector<key_spec>& out);
void add_storage(std::vector<key_spec>& out);
void add_transport(std::vector<key_spec>& out);
void add_gpu(std::vector<key_spec>& out);
void add_engines(std::vector<key_spec>& out);
void add_scheduler(std::vector<key_spec>& out);
void add_run(std::vector<key_spec>& out);
void add_sim(std::vector<key_spec>& out);
void add_caf(std::vector<key_spec>& out);
void add_observe(std::vector<key_spec>& out);

/// Appends the keys of one section to `out`; each call adds the key
/// `<section>.<name>`. Holds `out` by reference: use it within the add_*
/// function that owns `out`.
class section_keys {
public:
  section_keys(std::vector<key_spec>& out, std::string section);

  /// The `<section>.profile` key: a string whose choices are the profiles
  /// of the section (config/profiles.cpp).
  void profile(std::string def);
  void boolean(const std::string& name, bool def, std::string meaning);
  void integer(const std::string& name, int64_t def, std::string unit,
               range limits, std::string meaning);
  void real(const std::string& name, double def, std::string unit, range limits,
            std::string meaning);
  void string(const std::string& name, std::string def, std::string meaning);
  void choice(const std::string& name, std::string def,
              std::vector<std::string> choices, std::string meaning);

private:
  void add(const std::string& name, value_type type, value def,
           std::string unit, range limits, std::vector<std::string> choices,
           std::string meaning);

  std::vector<key_spec>& out_;
  std::string section_;
};

} // namespace dualpath::config::keys
