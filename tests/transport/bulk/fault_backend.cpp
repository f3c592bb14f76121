// ctest-label: transport
// The fault-injection decorator around a real tcp backend pair: fail after N,
// drop peer (and reconnect once the fault is gone), delay, injected failures
// that overtake delayed completions, corrupt a byte on the wire while the
// caller's buffer stays intact.
#include <doctest/doctest.h>

#include <cstring>
#include <future>

#include "tests/transport/bulk/post_wait.hpp"
#include "transport/bulk/backend.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

options opts_for(const std::string& node) {
  options o;
  o.node = node;
  o.secret = "fault";
  return o;
}

struct fixture {
  std::unique_ptr<backend> a;
  std::unique_ptr<backend> b = std::move(*make_tcp_backend(opts_for("b")));
  std::vector<uint8_t> src = std::vector<uint8_t>(8192, 0x11);
  std::vector<uint8_t> dst = std::vector<uint8_t>(8192, 0);
  caf::expected<local_registration> rs{caf::none};
  caf::expected<local_registration> rd{caf::none};

  explicit fixture(fault_plan plan) {
    a = make_fault_backend(std::move(*make_tcp_backend(opts_for("a"))),
                           std::move(plan));
    REQUIRE(!a->connect("b", *b->details_for("a")));
    rs = a->register_region(src.data(), src.size());
    rd = b->register_region(dst.data(), dst.size());
    REQUIRE(rs);
    REQUIRE(rd);
  }

  completion write(uint64_t len = 8192) {
    batch x;
    x.writes.push_back({&*rs, 0, *rd->describe().subrange(0, len)});
    return dualpath::test::post_and_wait(*a, std::move(x), 5s);
  }
};

transport_errc code_of(const completion& c) {
  return static_cast<transport_errc>(c.error.code());
}

} // namespace

TEST_CASE("fail after N: the first N batches pass, the rest fail injected") {
  fault_plan plan;
  plan.fail_after = 2;
  fixture f{plan};
  CHECK(!f.write().error);
  CHECK(!f.write().error);
  auto c = f.write();
  CHECK(code_of(c) == transport_errc::injected_fault);
  CHECK(c.failed_ops == 1);
  CHECK(code_of(f.write()) == transport_errc::injected_fault);
}

TEST_CASE("drop peer: writes to that peer fail with peer_lost") {
  fault_plan plan;
  plan.drop_peer = "b";
  fixture f{plan};
  CHECK(code_of(f.write()) == transport_errc::peer_lost);
  CHECK(std::all_of(f.dst.begin(), f.dst.end(), [](uint8_t v) { return !v; }));
}

TEST_CASE("delay: completions arrive no earlier than the delay") {
  fault_plan plan;
  plan.delay = 150ms;
  fixture f{plan};
  auto start = clock_type::now();
  CHECK(!f.write().error);
  CHECK(clock_type::now() - start >= 150ms);
}

TEST_CASE("fail at once: an injected failure overtakes a delayed completion") {
  fault_plan plan;
  plan.delay = 300ms;
  plan.fail_after = 1;
  plan.fail_at_once = true;
  fixture f{plan};
  std::promise<clock_type::time_point> ok, failed;
  auto post = [&](std::promise<clock_type::time_point>& p) {
    batch x;
    x.writes.push_back({&*f.rs, 0, *f.rd->describe().subrange(0, 64)});
    f.a->post(std::move(x),
              [&p](completion) { p.set_value(clock_type::now()); });
  };
  auto start = clock_type::now();
  post(ok);     // passes, its completion held back 300 ms
  post(failed); // injected: at once
  auto t_failed = failed.get_future().get();
  auto t_ok = ok.get_future().get();
  CHECK(t_failed < t_ok);
  CHECK(t_ok - start >= 300ms);
}

TEST_CASE("corrupt byte: the receiver sees one flipped byte, the sender's "
          "buffer is restored") {
  fault_plan plan;
  plan.corrupt_byte = true;
  fixture f{plan};
  CHECK(!f.write().error);
  CHECK(f.dst[0] == static_cast<uint8_t>(0x11 ^ 0xFF));
  CHECK(std::all_of(f.dst.begin() + 1, f.dst.end(),
                    [](uint8_t v) { return v == 0x11; }));
  CHECK(f.src[0] == 0x11);
}
