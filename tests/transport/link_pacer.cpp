// ctest-label: storage
// The pacing arithmetic of an emulated link: serialised reservations at the
// configured rate, exact over many small transfers, unpaced at rate 0.
#include <doctest/doctest.h>

#include "transport/link_pacer.hpp"

using dualpath::transport::link_pacer;
using namespace std::chrono;

TEST_CASE("rate 0 is unpaced") {
  link_pacer p{0};
  auto t0 = link_pacer::time_point{seconds{5}};
  CHECK(p.reserve(1 << 30, t0) == t0);
  CHECK_EQ(p.reserved_bytes(), uint64_t{1} << 30);
}

TEST_CASE("reservations serialise at the rate") {
  link_pacer p{1000000}; // 1 MB/s: 1 byte per microsecond
  auto t0 = link_pacer::time_point{seconds{1}};
  CHECK(p.reserve(1000, t0) == t0 + microseconds{1000});
  // A second transfer at the same instant queues behind the first.
  CHECK(p.reserve(500, t0) == t0 + microseconds{1500});
  // A transfer after an idle gap starts at its own "now".
  auto later = t0 + seconds{1};
  CHECK(p.reserve(1000, later) == later + microseconds{1000});
  CHECK(p.busy_until() == later + microseconds{1000});
}

TEST_CASE("many small transfers add up exactly") {
  link_pacer p{3}; // 3 bytes/s: 1 byte = 333333333.33 ns
  auto t0 = link_pacer::time_point{};
  link_pacer::time_point end;
  for (int i = 0; i < 300; ++i)
    end = p.reserve(1, t0);
  CHECK(end == t0 + seconds{100});
}

TEST_CASE("huge reservations do not overflow") {
  link_pacer p{uint64_t{25} * 1000 * 1000 * 1000}; // 25 GB/s
  auto t0 = link_pacer::time_point{};
  CHECK(p.reserve(uint64_t{100} * 1000 * 1000 * 1000, t0) == t0 + seconds{4});
}
