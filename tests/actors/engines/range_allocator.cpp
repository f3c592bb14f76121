// ctest-label: engines
// The range allocator of the decode engine's DRAM buffer: refuses when full,
// merges on free, never exceeds the capacity.
#include <doctest/doctest.h>

#include "actors/engines/range_allocator.hpp"

using namespace dualpath::actors;

TEST_CASE("range allocator refuses when full and merges freed ranges") {
  range_allocator a{100};
  auto x = a.allocate(40);
  auto y = a.allocate(40);
  REQUIRE(x);
  REQUIRE(y);
  CHECK_EQ(*x, 0u);
  CHECK_EQ(*y, 40u);
  CHECK_FALSE(a.allocate(30)); // only 20 left: admission must wait
  CHECK_FALSE(a.allocate(0));
  auto z = a.allocate(20);
  REQUIRE(z);
  CHECK_EQ(a.used(), 100u);
  a.free(*x);
  a.free(*y);
  // x and y merged: 80 contiguous bytes at 0.
  auto w = a.allocate(80);
  REQUIRE(w);
  CHECK_EQ(*w, 0u);
  CHECK_EQ(a.high_water(), 100u);
  a.free(*w);
  a.free(*z);
  CHECK_EQ(a.used(), 0u);
  auto all = a.allocate(100);
  REQUIRE(all);
  a.free(12345); // unknown offsets are ignored
  CHECK_EQ(a.used(), 100u);
}
