// ctest-label: transport
// The shared weighted-round-robin arbiter on its own: byte shares follow the
// weights (default 99:1 and others) within 5% while both classes contend,
// also with the two classes asking from two threads; an idle class banks no
// credit; a lone class gets lone grants uncharged; a class that must wait is
// woken by the other's charge or un-ready; a ready class that stops asking
// (a starved thread) stops holding the other back.
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>

#include "transport/bulk/wrr.hpp"

using namespace dualpath::transport::bulk;

namespace {

constexpr size_t quantum = 64 * 1024;
constexpr size_t lone = 256 * 1024;

/// Both classes always ready; each round the class that may send sends a
/// random part of its grant.
std::array<uint64_t, 2> contend(uint32_t wc, uint32_t wk, int rounds) {
  shared_wrr arb{wc, wk};
  int64_t now = 1'000'000'000;
  arb.set_ready(0, true, now);
  arb.set_ready(1, true, now);
  std::mt19937 rng{1};
  std::array<uint64_t, 2> bytes{};
  for (int i = 0; i < rounds; ++i) {
    now += 1000;
    for (size_t c = 0; c < 2; ++c) {
      auto g = arb.acquire(c, quantum, lone, now);
      if (g.bytes == 0)
        continue;
      REQUIRE(g.contended);
      uint64_t n = 1 + rng() % g.bytes;
      arb.settle(c, g.bytes, n);
      bytes[c] += n;
    }
  }
  return bytes;
}

} // namespace

TEST_CASE("shares under contention follow the weights within 5%") {
  for (auto w :
       {std::pair<uint32_t, uint32_t>{99, 1}, {3, 1}, {1, 1}, {1, 4}}) {
    // Not structured bindings: INFO captures them in a lambda (clang).
    uint32_t wc = w.first, wk = w.second;
    auto b = contend(wc, wk, 400000);
    double share = double(b[0]) / double(b[0] + b[1]);
    double want = double(wc) / (wc + wk);
    INFO(wc << ":" << wk << " control share " << share);
    CHECK(std::abs(share - want) <= 0.05 * want);
    CHECK(std::abs((1 - share) - (1 - want)) <= 0.05 * (1 - want));
  }
}

TEST_CASE("two threads asking concurrently keep the shares") {
  shared_wrr arb{3, 1, int64_t{1} << 62}; // never stale
  arb.set_ready(0, true, 0);
  arb.set_ready(1, true, 0);
  std::array<std::atomic<uint64_t>, 2> bytes{};
  std::atomic<bool> stop{false};
  auto worker = [&](size_t c) {
    int64_t now = 1;
    while (!stop) {
      auto g = arb.acquire(c, quantum, lone, ++now);
      if (g.bytes == 0) {
        std::this_thread::yield();
        continue;
      }
      arb.settle(c, g.bytes, g.bytes);
      bytes[c] += g.bytes;
    }
  };
  std::thread a{worker, 0}, b{worker, 1};
  while (bytes[0] + bytes[1] < (uint64_t{4} << 30))
    std::this_thread::yield();
  stop = true;
  a.join();
  b.join();
  double share = double(bytes[0]) / double(bytes[0] + bytes[1]);
  INFO("control share " << share);
  CHECK(std::abs(share - 0.75) <= 0.05 * 0.75);
}

TEST_CASE("an idle class banks no credit") {
  shared_wrr arb{1, 1};
  int64_t now = 1'000'000'000;
  arb.set_ready(1, true, now);
  // kv alone sends 100 MiB in lone grants, uncharged.
  for (int i = 0; i < 400; ++i) {
    auto g = arb.acquire(1, quantum, lone, ++now);
    REQUIRE(g.bytes == lone);
    REQUIRE(!g.contended);
  }
  CHECK(arb.charged(1) == 0);
  // Control arrives: it does not monopolise the link; kv is served again
  // within a grant or two.
  arb.set_ready(0, true, ++now);
  int control_in_a_row = 0;
  while (control_in_a_row < 100) {
    auto g = arb.acquire(0, quantum, lone, ++now);
    if (g.bytes == 0)
      break;
    ++control_in_a_row;
  }
  CHECK(control_in_a_row <= 2);
  CHECK(arb.acquire(1, quantum, lone, ++now).bytes == quantum);
}

TEST_CASE("a waiting class is woken by the other's charge or un-ready") {
  shared_wrr arb{1, 1};
  int64_t now = 1'000'000'000;
  arb.set_ready(0, true, now);
  arb.set_ready(1, true, now);
  // Both ask; control soon leads by a quantum and must wait.
  REQUIRE(arb.acquire(1, quantum, lone, ++now).bytes == quantum);
  int granted = 0;
  while (arb.acquire(0, quantum, lone, ++now).bytes != 0)
    REQUIRE(++granted <= 3);
  CHECK(granted >= 1);
  // kv's next charge lets control go again, and says so.
  auto g = arb.acquire(1, quantum, lone, ++now);
  CHECK(g.bytes == quantum);
  CHECK(g.wake_other);
  // Control must wait again after its grants; kv leaving wakes it.
  while (arb.acquire(0, quantum, lone, ++now).bytes != 0) {
  }
  CHECK(arb.set_ready(1, false, ++now));
  auto alone = arb.acquire(0, quantum, lone, ++now);
  CHECK(alone.bytes == lone);
  CHECK(!alone.contended);
}

TEST_CASE("a ready class that stops asking no longer holds the other back") {
  const int64_t stale = 1'000'000;
  shared_wrr arb{1, 1, stale};
  int64_t now = 1'000'000'000;
  arb.set_ready(0, true, now);
  arb.set_ready(1, true, now);
  REQUIRE(arb.acquire(1, quantum, lone, now).bytes == quantum);
  while (arb.acquire(0, quantum, lone, now).bytes != 0) {
  }
  // kv's thread is starved of CPU: it never asks again. After `stale`
  // control sends alone.
  auto g = arb.acquire(0, quantum, lone, now + stale);
  CHECK(g.bytes == lone);
  CHECK(!g.contended);
}

TEST_CASE("nothing contending: a lone class gets every grant uncharged") {
  shared_wrr arb{99, 1};
  arb.set_ready(1, true, 1'000'000'000);
  for (int i = 0; i < 10; ++i) {
    auto g = arb.acquire(1, quantum, lone, 1'000'000'000 + i);
    CHECK(g.bytes == lone);
    CHECK(!g.contended);
  }
  CHECK(arb.charged(1) == 0);
}
