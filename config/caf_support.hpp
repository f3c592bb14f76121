// Small CAF 0.17.6 helpers shared by every module (config is the module every
// other one depends on).
#pragma once

#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>

namespace dualpath::config {

/// Registers the error category `category` of enum `E` (which has
/// `to_string(E)` found by ADL) so that `actor_system::render(err)` prints
/// "<prefix>: <code name> (<context>)". CAF 0.17.6's own templated
/// add_error_category<T> does not compile, hence this helper.
template <class E>
void add_error_category(caf::actor_system_config& cfg, caf::atom_value category,
                        std::string prefix) {
  cfg.add_error_category(category, [prefix](uint8_t code, caf::atom_value,
                                            const caf::message& ctx) {
    auto str = prefix + ": " + to_string(static_cast<E>(code));
    if (!ctx.empty()) {
      str += " (";
      str += ctx.match_element<std::string>(0) ? ctx.get_as<std::string>(0)
                                               : caf::to_string(ctx);
      str += ")";
    }
    return str;
  });
}

/// The message of `err`: its context string when it carries one, else the
/// name of its code when it is of `category` (the category of enum `E`),
/// else CAF's rendering; "no error" for an empty one.
template <class E>
std::string error_message(const caf::error& err, caf::atom_value category) {
  if (!err)
    return "no error";
  auto& ctx = err.context();
  if (!ctx.empty() && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  if (err.category() == category)
    return to_string(static_cast<E>(err.code()));
  return caf::to_string(err);
}

} // namespace dualpath::config
