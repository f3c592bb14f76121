// One function that every dualpath process calls on its actor_system_config
// before creating the actor system: registers every module's message types
// (by name, so they can cross the network) and error categories, and loads
// the io (middleman) and openssl modules.
#pragma once

#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>

namespace dualpath::actors {

/// Registers every message type and error category of every module.
void add_message_types(caf::actor_system_config& cfg);

/// Renders `err` as actor_system::render would, without an actor system:
/// "<subsystem>: <code> (<context>)" for every registered category.
std::string render(const caf::error& err);

/// The names under which dualpath's message types are registered, in type-ID
/// order (for tests and `--print-config`-style introspection).
std::vector<std::string> registered_type_names();

} // namespace dualpath::actors
