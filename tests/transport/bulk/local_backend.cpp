// ctest-label: transport
// The local (in-process) backend: byte-exact bounded copies with the same
// completion semantics and typed rejections as the network backends; and the
// backend factory's choice and fallback.
#include <doctest/doctest.h>

#include <cstring>
#include <future>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "tests/transport/bulk/post_wait.hpp"
#include "transport/bulk/backend.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

options named(const std::string& node) {
  options o;
  o.backend = "local";
  o.node = node;
  return o;
}

completion run(backend& b, batch x) {
  return dualpath::test::post_and_wait(b, std::move(x), 5s);
}

transport_errc code_of(const caf::error& e) {
  return static_cast<transport_errc>(e.code());
}

} // namespace

TEST_CASE("local writes land byte-exact and nothing outside the view") {
  auto fabric = make_local_fabric();
  auto a = make_local_backend(named("a"), fabric);
  auto b = make_local_backend(named("b"), fabric);
  REQUIRE(a);
  REQUIRE(b);
  std::vector<uint8_t> src(1 << 20), dst(1 << 20, 0);
  std::iota(src.begin(), src.end(), uint8_t{1});
  auto rs = (*a)->register_region(src.data(), src.size());
  auto rd = (*b)->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  std::promise<incoming_immediate> imm;
  (*b)->on_immediate([&](const incoming_immediate& x) { imm.set_value(x); });
  batch x;
  x.tag = 9;
  x.immediate = 77;
  x.writes.push_back({&*rs, 10, *rd->describe().subrange(1000, 5000)});
  x.writes.push_back({&*rs, 0, *rd->describe().subrange(200000, 3)});
  auto c = run(**a, std::move(x));
  CHECK(!c.error);
  CHECK(c.tag == 9);
  CHECK(c.bytes == 5003);
  CHECK(std::memcmp(dst.data() + 1000, src.data() + 10, 5000) == 0);
  CHECK(std::memcmp(dst.data() + 200000, src.data(), 3) == 0);
  CHECK(dst[999] == 0);
  CHECK(dst[6000] == 0);
  CHECK(dst[200003] == 0);
  CHECK(std::count(dst.begin(), dst.end(), 0) >= dst.size() - 5003 - 20);
  auto f = imm.get_future();
  REQUIRE(f.wait_for(1s) == std::future_status::ready);
  CHECK(f.get().value == 77);
}

TEST_CASE("local rejects bad destinations with typed errors") {
  auto fabric = make_local_fabric();
  auto a = std::move(*make_local_backend(named("a"), fabric));
  auto b = std::move(*make_local_backend(named("b"), fabric));
  std::vector<uint8_t> src(4096, 1), dst(4096, 0);
  auto rs = a->register_region(src.data(), src.size());
  auto rd = b->register_region(dst.data(), dst.size());
  auto good = rd->describe();
  auto expect = [&](remote_region r, transport_errc code) {
    batch x;
    x.writes.push_back({&*rs, 0, r});
    auto c = run(*a, std::move(x));
    CHECK(code_of(c.error) == code);
    CHECK(c.failed_ops == 1);
  };
  auto r = good;
  r.region_id += 7;
  r.length = 16;
  expect(r, transport_errc::unknown_region);
  r = good;
  r.key ^= 2;
  r.length = 16;
  expect(r, transport_errc::wrong_key);
  r = good;
  r.offset = 4000;
  r.length = 200;
  expect(r, transport_errc::out_of_bounds);
  r = good;
  r.node = "nobody";
  r.length = 16;
  expect(r, transport_errc::peer_lost);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
  CHECK(!good.subrange(4000, 200));
  CHECK(!good.subrange(~uint64_t{0}, 2));
}

TEST_CASE("local batches past their deadline fail") {
  auto fabric = make_local_fabric();
  auto a = std::move(*make_local_backend(named("a"), fabric));
  std::vector<uint8_t> buf(64);
  auto r = a->register_region(buf.data(), buf.size());
  batch x;
  x.deadline = clock_type::now() - 1ms;
  x.writes.push_back({&*r, 0, *r->describe().subrange(0, 8)});
  CHECK(code_of(run(*a, std::move(x)).error)
        == transport_errc::deadline_exceeded);
  CHECK(a->stats().deadline_exceeded == 1);
}

TEST_CASE("ending a source's registration waits for the batches that read "
          "it; a source registered elsewhere is refused at post") {
  auto fabric = make_local_fabric();
  auto a = std::move(*make_local_backend(named("a"), fabric));
  auto b = std::move(*make_local_backend(named("b"), fabric));
  constexpr size_t n = 64;
  constexpr size_t len = 1 << 20;
  auto src_bytes = std::make_unique<std::vector<uint8_t>>(n * len);
  std::iota(src_bytes->begin(), src_bytes->end(), uint8_t{3});
  const auto want = *src_bytes;
  std::vector<uint8_t> dst(n * len, 0);
  auto reg = a->register_region(src_bytes->data(), src_bytes->size());
  auto to = b->register_region(dst.data(), dst.size());
  REQUIRE(reg);
  REQUIRE(to);
  std::optional<local_registration> src{std::move(*reg)};
  std::mutex mtx;
  std::vector<completion> done;
  for (size_t i = 0; i < n; ++i) {
    batch x;
    x.writes.push_back(
        {&*src, i * len, *to->describe().subrange(i * len, len)});
    a->post(std::move(x), [&](completion c) {
      std::lock_guard<std::mutex> guard{mtx};
      done.push_back(std::move(c));
    });
  }
  // Ended (and the memory freed) while the worker still copies from it.
  src.reset();
  {
    std::lock_guard<std::mutex> guard{mtx};
    CHECK(done.size() >= n - 1); // the last one's sink may still be running
  }
  src_bytes.reset();
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (done.size() == n)
        break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard<std::mutex> guard{mtx};
  REQUIRE(done.size() == n);
  for (auto& c : done)
    CHECK(!c.error);
  CHECK(dst == want);
  // A registration of another backend is not a source of this one.
  auto c = run(*a, [&] {
    batch x;
    x.writes.push_back({&*to, 0, *to->describe().subrange(0, 16)});
    return x;
  }());
  CHECK(code_of(c.error) == transport_errc::unknown_region);
}

TEST_CASE("the factory picks by name and says why") {
  options o;
  o.secret = "x";
  o.backend = "auto";
  auto b = make_backend(o);
  REQUIRE(b);
  // auto decides per peer (tests/transport/bulk/auto_backend.cpp).
  CHECK(b->chosen->caps().name == "auto");
  CHECK(b->reason.rfind("auto: ", 0) == 0);
  o.backend = "local";
  auto l = make_backend(o);
  REQUIRE(l);
  CHECK(l->chosen->caps().name == "local");
  CHECK(l->reason == "local");
  o.backend = "carrier-pigeon";
  CHECK(!make_backend(o));
  o.backend = "tcp";
  o.secret.clear();
  auto t = make_backend(o);
  REQUIRE(!t);
  CHECK(code_of(t.error()) == transport_errc::unauthenticated);
}

TEST_CASE("options come from the transport.* configuration keys") {
  dualpath::config::settings cfg;
  auto o = options_from(cfg, "n1");
  REQUIRE(o);
  CHECK(o->node == "n1");
  CHECK(o->backend == "auto");
  CHECK(o->weight_control == 99);
  CHECK(o->weight_kv == 1);
  CHECK(o->slice_kib == 1024);
  CHECK(!o->secret.empty()); // generated when unset
  CHECK(o->listen_host == "127.0.0.1");
  CHECK(o->listen_port == 0);
  REQUIRE(!cfg.set_text("transport.tcp_listen", "127.0.0.1:7001",
                        dualpath::config::value_source::override_value, "t"));
  REQUIRE(!cfg.set_text("transport.weight_kv", "3",
                        dualpath::config::value_source::override_value, "t"));
  o = options_from(cfg, "n1");
  REQUIRE(o);
  CHECK(o->listen_port == 7001);
  CHECK(o->weight_kv == 3);
  for (auto bad : {"no-port", "127.0.0.1:", "127.0.0.1:99999", "h:12x"}) {
    INFO(bad);
    REQUIRE(!cfg.set_text("transport.tcp_listen", bad,
                          dualpath::config::value_source::override_value, "t"));
    auto e = options_from(cfg, "n1");
    REQUIRE(!e);
    CHECK(code_of(e.error()) == transport_errc::bad_config);
  }
}
