// Test helper: the configuration's defaults with overrides applied, as a
// command line's --set would give them (header only: only test executables
// that link the config library include it).
#pragma once

#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "config/settings.hpp"

namespace dualpath::test {

/// The settings of the defaults with `ovs` ("section.key=value") applied;
/// fails the test when they do not load.
inline config::settings settings_with(std::vector<config::override_entry> ovs) {
  config::load_request req;
  req.overrides = std::move(ovs);
  auto cfg = config::load(req);
  REQUIRE(cfg);
  return std::move(*cfg);
}

} // namespace dualpath::test
