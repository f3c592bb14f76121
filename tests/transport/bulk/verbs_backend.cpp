// ctest-label: transport
// The verbs backend between two endpoints of one device (loopback through the
// HCA): queue-pair exchange, byte-exact RDMA WRITEs, WRITE_WITH_IMM, bad rkeys
// and deadlines. Skips, saying why, where no RDMA device exists.
#include <doctest/doctest.h>

#include <cstring>
#include <future>

#include "tests/support/support.hpp"
#include "transport/bulk/backend.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<backend> open_or_skip(const std::string& node) {
  options o;
  o.node = node;
  if (auto dev = std::getenv("DUALPATH_VERBS_DEVICE"))
    o.verbs_device = dev;
  auto b = make_verbs_backend(o);
  if (!b)
    dualpath::test::skip_suite(
        "transport.bulk.verbs_backend",
        "verbs backend unavailable ("
            + to_string(static_cast<transport_errc>(b.error().code()))
            + "): " + b.error().context().get_as<std::string>(0));
  return std::move(*b);
}

struct verbs_pair {
  std::unique_ptr<backend> a = open_or_skip("a");
  std::unique_ptr<backend> b = open_or_skip("b");
  verbs_pair() {
    auto da = a->details_for("b");
    auto db = b->details_for("a");
    REQUIRE(da);
    REQUIRE(db);
    REQUIRE(!a->connect("b", *db));
    REQUIRE(!b->connect("a", *da));
  }
};

completion run(backend& b, batch x) {
  std::promise<completion> p;
  auto f = p.get_future();
  b.post(std::move(x), [&](completion c) { p.set_value(std::move(c)); });
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  return f.get();
}

} // namespace

TEST_CASE("verbs writes land byte-exact and signal immediates") {
  verbs_pair p;
  std::vector<uint8_t> src(4 << 20), dst(4 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 7);
  auto rs = p.a->register_region(src.data(), src.size());
  auto rd = p.b->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  std::promise<uint32_t> imm;
  p.b->on_immediate(
      [&](const incoming_immediate& x) { imm.set_value(x.value); });
  batch x;
  x.tclass = traffic_class::control;
  x.immediate = 1234;
  for (uint64_t off : {0ull, 4097ull, 1ull << 20})
    x.writes.push_back({&*rs, off, *rd->describe().subrange(off, 65536)});
  auto c = run(*p.a, std::move(x));
  CHECK(!c.error);
  CHECK(c.bytes == 3 * 65536);
  for (uint64_t off : {0ull, 4097ull, 1ull << 20})
    CHECK(std::memcmp(dst.data() + off, src.data() + off, 65536) == 0);
  auto f = imm.get_future();
  REQUIRE(f.wait_for(2s) == std::future_status::ready);
  CHECK(f.get() == 1234);
}

TEST_CASE("verbs rejects a wrong rkey with a typed error") {
  verbs_pair p;
  std::vector<uint8_t> src(4096, 1), dst(4096, 0);
  auto rs = p.a->register_region(src.data(), src.size());
  auto rd = p.b->register_region(dst.data(), dst.size());
  auto bad = rd->describe();
  bad.key ^= 0x5a5a;
  batch x;
  x.writes.push_back({&*rs, 0, bad});
  auto c = run(*p.a, std::move(x));
  CHECK(static_cast<transport_errc>(c.error.code())
        == transport_errc::wrong_key);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
}
