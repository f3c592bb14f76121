// ctest-label: engines
// post_or_complete: a batch a backend completes inside post() (the modeled
// backend) comes back as a value and the later path is never taken; a batch
// completed on a backend thread (the local backend) reaches `later` exactly
// once. Either way the bytes and the error are the backend's.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>

#include "actors/bulk/bulk_post.hpp"
#include "transport/bulk/modeled_backend.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

options named(const std::string& node, const std::string& kind) {
  options o;
  o.backend = kind;
  o.node = node;
  return o;
}

} // namespace

TEST_CASE("a batch completed inside post() is returned, never sent later") {
  auto fabric = make_modeled_fabric();
  auto a = make_modeled_backend(named("a", "modeled"), fabric);
  auto b = make_modeled_backend(named("b", "modeled"), fabric);
  REQUIRE(a);
  REQUIRE(b);
  std::vector<uint8_t> src(4096), dst(4096);
  auto rs = (*a)->register_region(src.data(), src.size());
  auto rd = (*b)->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  std::atomic<int> later{0};
  batch x;
  x.tag = 5;
  x.writes.push_back({&*rs, 0, *rd->describe().subrange(100, 1000)});
  auto c = post_or_complete(**a, std::move(x), [&](completion) { ++later; });
  REQUIRE(c);
  CHECK(!c->error);
  CHECK_EQ(c->tag, 5u);
  CHECK_EQ(c->bytes, 1000u);
  CHECK_EQ(later.load(), 0);
  // A write outside the target region fails the same way, as a value.
  batch bad;
  bad.tag = 6;
  auto view = rd->describe();
  view.length += 1; // claims one byte more than was registered
  bad.writes.push_back({&*rs, 0, view});
  auto e = post_or_complete(**a, std::move(bad), [&](completion) { ++later; });
  REQUIRE(e);
  CHECK(e->error);
  CHECK_EQ(later.load(), 0);
}

TEST_CASE("a batch completed on a backend thread reaches `later` once") {
  auto fabric = make_local_fabric();
  auto a = make_local_backend(named("a", "local"), fabric);
  auto b = make_local_backend(named("b", "local"), fabric);
  REQUIRE(a);
  REQUIRE(b);
  std::vector<uint8_t> src(1 << 16), dst(1 << 16, 0);
  std::iota(src.begin(), src.end(), uint8_t{1});
  auto rs = (*a)->register_region(src.data(), src.size());
  auto rd = (*b)->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  int returned = 0;
  std::atomic<int> later{0};
  std::promise<completion> got;
  for (int i = 0; i < 50; ++i) {
    batch x;
    x.tag = static_cast<uint64_t>(i);
    x.writes.push_back({&*rs, 0, *rd->describe().subrange(0, src.size())});
    auto c = post_or_complete(**a, std::move(x), [&](completion c) {
      if (++later == 1)
        got.set_value(std::move(c));
    });
    if (c)
      ++returned;
  }
  // Every batch completed exactly once, by one of the two paths.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (returned + later.load() < 50
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  CHECK_EQ(returned + later.load(), 50);
  if (later.load() > 0) {
    auto f = got.get_future();
    REQUIRE(f.wait_for(1s) == std::future_status::ready);
    auto c = f.get();
    CHECK(!c.error);
    CHECK_EQ(c.bytes, src.size());
  }
  CHECK(std::equal(src.begin(), src.end(), dst.begin()));
}
