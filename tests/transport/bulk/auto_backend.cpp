// ctest-label: transport
// transport.backend = auto between real backends of one process: the choice
// is made per peer -- verbs where this node has a working RDMA device and the
// peer's verbs handshake succeeds, tcp otherwise -- reported through
// options::notice and counted in counters::tcp_fallbacks; writes land
// byte-exact either way under one region descriptor. Without an RDMA device
// (the build hosts) every peer is a tcp fallback; with devices (the rdma-vm
// guest, tests/rdma/vm-check) peers with verbs use it and a peer without
// verbs is a fallback.
#include <doctest/doctest.h>

#include <future>
#include <mutex>

#include "config/errors.hpp"
#include "tests/transport/bulk/post_wait.hpp"
#include "transport/bulk/backend.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

struct node {
  std::unique_ptr<backend> be;
  std::string reason;
  std::mutex mtx;
  std::vector<std::string> notices;

  explicit node(const std::string& name, const std::string& device = "") {
    options o;
    o.backend = "auto";
    o.node = name;
    o.secret = "auto-test";
    o.verbs_device = device;
    o.notice = [this](const std::string& s) {
      std::lock_guard<std::mutex> guard{mtx};
      notices.push_back(s);
    };
    auto made = make_backend(o);
    REQUIRE_MESSAGE(made,
                    (made ? "" : dualpath::config::message_of(made.error())));
    be = std::move(made->chosen);
    reason = made->reason;
  }

  bool said(const std::string& text) {
    std::lock_guard<std::mutex> guard{mtx};
    for (auto& n : notices)
      if (n.find(text) != std::string::npos)
        return true;
    return false;
  }
};

bool have_device() {
  options o;
  o.node = "probe";
  o.secret = "x";
  auto v = make_verbs_backend(o);
  return static_cast<bool>(v);
}

completion run(backend& b, batch x) {
  return dualpath::test::post_and_wait(b, std::move(x), 30s);
}

/// Writes 64 KiB a -> b and checks them byte for byte.
void write_and_check(node& a, node& b, uint8_t seed) {
  std::vector<uint8_t> src(65536), dst(65536, 0);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 31 + seed);
  auto rs = a.be->register_region(src.data(), src.size());
  auto rd = b.be->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  std::promise<uint32_t> imm;
  b.be->on_immediate(
      [&](const incoming_immediate& x) { imm.set_value(x.value); });
  batch x;
  x.writes.push_back({&*rs, 0, rd->describe()});
  x.immediate = seed;
  auto c = run(*a.be, std::move(x));
  REQUIRE_MESSAGE(!c.error, dualpath::config::message_of(c.error));
  CHECK(c.bytes == src.size());
  CHECK(src == dst);
  auto f = imm.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  CHECK(f.get() == seed);
  b.be->on_immediate(nullptr);
}

} // namespace

TEST_CASE("auto connects each peer over verbs where it can, else tcp") {
  bool verbs = have_device();
  MESSAGE("RDMA device present: " << std::string{verbs ? "yes" : "no"});
  node a{"a"}, b{"b"};
  CHECK(a.be->caps().name == "auto");
  CHECK(a.be->caps().cross_process);
  auto db = b.be->details_for("a");
  REQUIRE(db);
  std::string details{db->begin(), db->end()};
  CHECK(details.rfind("tcp=", 0) == 0);
  CHECK((details.find(";verbs=") != std::string::npos) == verbs);
  REQUIRE(!a.be->connect("b", *db));
  if (verbs) {
    CHECK(a.reason.find("auto: verbs on") == 0);
    CHECK(a.said("bulk transport to b: verbs"));
    CHECK(a.be->stats().tcp_fallbacks == 0);
  } else {
    CHECK(a.reason.find("auto: tcp towards every peer (no verbs") == 0);
    CHECK(a.said("bulk transport to b: tcp fallback"));
    CHECK(a.said("dualpath_bulk_tcp_fallback_total 1"));
    CHECK(a.be->stats().tcp_fallbacks == 1);
  }
  write_and_check(a, b, 7);
  // The other direction is a choice of its own, counted on its own.
  REQUIRE(!b.be->connect("a", *a.be->details_for("b")));
  write_and_check(b, a, 9);
  CHECK(b.be->stats().tcp_fallbacks == (verbs ? 0u : 1u));
  CHECK(a.be->stats().batches_completed == 1);
}

TEST_CASE("a peer without verbs is a tcp fallback, counted per peer") {
  node a{"a"};
  // "c" has no usable RDMA device (one that does not exist), so it offers
  // tcp only; a falls back for c whether or not a has verbs itself.
  node c{"c", "no-such-rdma-device"};
  CHECK(c.reason.find("auto: tcp towards every peer") == 0);
  auto before = a.be->stats().tcp_fallbacks;
  REQUIRE(!a.be->connect("c", *c.be->details_for("a")));
  CHECK(a.be->stats().tcp_fallbacks == before + 1);
  CHECK(a.said("bulk transport to c: tcp fallback"));
  write_and_check(a, c, 3);
  // A plain tcp peer's details ("host:port") are understood as well.
  options o;
  o.backend = "tcp";
  o.node = "t";
  o.secret = "auto-test";
  auto t = make_tcp_backend(o);
  REQUIRE(t);
  REQUIRE(!a.be->connect("t", *(*t)->details_for("a")));
  CHECK(a.be->stats().tcp_fallbacks == before + 2);
  // Dropping a peer forgets its route: posts fail until it connects again.
  a.be->drop_peer("c");
  std::vector<uint8_t> buf(16);
  auto r = a.be->register_region(buf.data(), buf.size());
  REQUIRE(r);
  remote_region far = r->describe();
  far.node = "nowhere";
  batch x;
  x.writes.push_back({&*r, 0, far});
  auto res = run(*a.be, std::move(x));
  CHECK(static_cast<transport_errc>(res.error.code())
        == transport_errc::peer_lost);
}

TEST_CASE("auto refuses GPU memory (tcp peers could not reach it)") {
  node a{"a"};
  char buf[64];
  auto r = a.be->register_region(buf, sizeof(buf), memory_kind::device, 3);
  REQUIRE(!r);
  CHECK(static_cast<transport_errc>(r.error().code())
        == transport_errc::unsupported);
}
