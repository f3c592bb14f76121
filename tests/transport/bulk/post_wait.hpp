// Posting one batch and waiting for its completion, for the bulk backend
// suites (local, auto, fault, verbs).
#pragma once

#include <chrono>
#include <future>
#include <utility>

#include <doctest/doctest.h>

#include "transport/bulk/backend.hpp"

namespace dualpath::test {

/// Posts `x` on `b` and returns its completion; the test fails when none
/// arrives within `limit`.
inline transport::bulk::completion post_and_wait(transport::bulk::backend& b,
                                                 transport::bulk::batch x,
                                                 std::chrono::seconds limit) {
  std::promise<transport::bulk::completion> p;
  auto f = p.get_future();
  b.post(std::move(x),
         [&](transport::bulk::completion c) { p.set_value(std::move(c)); });
  REQUIRE(f.wait_for(limit) == std::future_status::ready);
  return f.get();
}

} // namespace dualpath::test
