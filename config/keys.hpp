// Internal to config/: one function per section appends that section's keys
// to the schema (defined in config/keys_<section>.cpp, listed in schema.cpp).
#pragma once

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

/// The `<section>.profile` key: a string whose choices are the profiles of
/// `section` (config/profiles.cpp).
key_spec profile_key(const std::string& section, std::string def);

} // namespace dualpath::config::keys
