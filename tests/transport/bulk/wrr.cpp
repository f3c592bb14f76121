// ctest-label: transport
// The weighted-round-robin arbiter on its own: byte shares follow the weights
// (default 99:1 and others) within 5% while both classes contend, an idle
// class banks no credit, and a lone class gets everything.
#include <doctest/doctest.h>

#include <random>

#include "transport/bulk/wrr.hpp"

using namespace dualpath::transport::bulk;

namespace {

/// Both classes always eligible; grants of random sizes up to 64 KiB.
std::array<uint64_t, 2> contend(uint32_t wc, uint32_t wk, int rounds) {
  wrr_arbiter arb{wc, wk};
  std::mt19937 rng{1};
  std::array<uint64_t, 2> bytes{};
  for (int i = 0; i < rounds; ++i) {
    auto c = arb.pick({true, true});
    REQUIRE(c >= 0);
    uint64_t n = 1 + rng() % (64 * 1024);
    arb.charge(c, n);
    bytes[c] += n;
  }
  return bytes;
}

} // namespace

TEST_CASE("shares under contention follow the weights within 5%") {
  for (auto [wc, wk] :
       {std::pair<uint32_t, uint32_t>{99, 1}, {3, 1}, {1, 1}, {1, 4}}) {
    auto b = contend(wc, wk, 200000);
    double share = double(b[0]) / double(b[0] + b[1]);
    double want = double(wc) / (wc + wk);
    INFO(wc << ":" << wk << " control share " << share);
    CHECK(std::abs(share - want) <= 0.05 * want);
    CHECK(std::abs((1 - share) - (1 - want)) <= 0.05 * (1 - want));
  }
}

TEST_CASE("an idle class banks no credit") {
  wrr_arbiter arb{1, 1};
  // kv alone sends 100 MiB.
  for (int i = 0; i < 1600; ++i) {
    REQUIRE(arb.pick({false, true}) == 1);
    arb.charge(1, 64 * 1024);
  }
  // Control arrives: it must not monopolise the link for 100 MiB; within a
  // few grants kv is served again.
  int control_in_a_row = 0;
  while (arb.pick({true, true}) == 0 && control_in_a_row < 100) {
    arb.charge(0, 64 * 1024);
    ++control_in_a_row;
  }
  CHECK(control_in_a_row <= 2);
}

TEST_CASE("nothing eligible picks nothing; a lone class gets every grant") {
  wrr_arbiter arb{99, 1};
  CHECK(arb.pick({false, false}) == -1);
  for (int i = 0; i < 10; ++i) {
    CHECK(arb.pick({false, true}) == 1);
    arb.charge(1, 1 << 20);
  }
}
