// ctest-label: transport
// Two bulk endpoint actors over real tcp backends on loopback: the three-step
// connect, a write batch whose bytes land in the peer's registered region
// while only descriptors cross CAF, typed failures in batch_completion, and a
// slow connect (a handshake that takes seconds) that holds neither its
// endpoint nor the node's only scheduler thread.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <chrono>
#include <cstring>

#include "actors/bulk/bulk_endpoint.hpp"
#include "actors/protocol/register.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace std::chrono_literals;
namespace bulk = dualpath::transport::bulk;

namespace {

struct test_config : caf::actor_system_config {
  test_config() {
    dualpath::actors::add_message_types(*this);
  }
};

std::shared_ptr<bulk::backend> tcp(const std::string& node) {
  bulk::options o;
  o.node = node;
  o.secret = "endpoint-test";
  auto b = bulk::make_tcp_backend(o);
  REQUIRE(b);
  return std::shared_ptr<bulk::backend>{std::move(*b)};
}

template <class T, class Handle, class... Ts>
T ask(caf::scoped_actor& self, const Handle& h, Ts&&... xs) {
  T result;
  self->request(h, 5s, std::forward<Ts>(xs)...)
      .receive([&](T& x) { result = std::move(x); },
               [&](caf::error& err) {
                 FAIL("request failed: " << caf::to_string(err));
               });
  return result;
}

} // namespace

TEST_CASE("endpoints connect and move a batch's bytes outside CAF") {
  test_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto be_a = tcp("a");
  auto be_b = tcp("b");
  auto dir_a = std::make_shared<region_directory>();
  auto dir_b = std::make_shared<region_directory>();
  std::vector<uint8_t> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 13 + 1);
  auto rs = be_a->register_region(src.data(), src.size());
  auto rd = be_b->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  dir_a->add(*rs);
  {
    auto a = spawn_bulk_endpoint(sys, be_a, dir_a);
    auto b = spawn_bulk_endpoint(sys, be_b, dir_b);
    auto info_a = ask<endpoint_info>(self, a, connect_atom_v,
                                     endpoint_info{"b", "", "", {}});
    CHECK(info_a.node == "a");
    CHECK(info_a.backend == "tcp");
    CHECK(info_a.address.rfind("127.0.0.1:", 0) == 0);
    auto info_b = ask<endpoint_info>(self, b, connect_atom_v, info_a);
    ask<endpoint_info>(self, a, connect_atom_v, info_b);
    auto d = ask<endpoint_info>(self, b, describe_atom_v);
    CHECK(d.node == "b");

    write_batch wb;
    wb.tag = 5;
    wb.tclass = transport::traffic_class::kv;
    wb.ops.push_back(write_op{rs->id(), 0, *rd->describe().subrange(0, 4096)});
    wb.ops.push_back(
        write_op{rs->id(), 8192, *rd->describe().subrange(500000, 300000)});
    auto c = ask<batch_completion>(self, a, write_atom_v, wb);
    CHECK(!c.error);
    CHECK(c.tag == 5);
    CHECK(c.bytes == 304096);
    CHECK(std::memcmp(dst.data(), src.data(), 4096) == 0);
    CHECK(std::memcmp(dst.data() + 500000, src.data() + 8192, 300000) == 0);

    SUBCASE("unknown local region") {
      write_batch bad = wb;
      bad.ops[0].local_region = 999;
      auto e = ask<batch_completion>(self, a, write_atom_v, bad);
      CHECK(e.failed_ops == 2);
      CHECK(e.error == transport::transport_errc::unknown_region);
    }
    SUBCASE("wrong key at the receiver") {
      write_batch bad = wb;
      bad.ops[1].destination.key ^= 1;
      auto e = ask<batch_completion>(self, a, write_atom_v, bad);
      CHECK(e.failed_ops == 2);
      CHECK(e.error == transport::transport_errc::wrong_key);
    }
    SUBCASE("deadline already short") {
      write_batch slow = wb;
      slow.deadline_ns = 1; // 1 ns: expires before the sender runs
      auto e = ask<batch_completion>(self, a, write_atom_v, slow);
      // Either it raced through or it missed the deadline; never silence.
      if (e.error)
        CHECK(e.error == transport::transport_errc::deadline_exceeded);
    }
    self->send_exit(a, caf::exit_reason::user_shutdown);
    self->send_exit(b, caf::exit_reason::user_shutdown);
  }
  dir_a->remove(rs->id());
}

TEST_CASE("a slow connect holds neither the endpoint nor a scheduler thread") {
  test_config cfg;
  // One scheduler thread: a connect blocking inside an actor would stall
  // every actor of the node for as long as it takes.
  cfg.set("scheduler.max-threads", 1);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  bulk::options o;
  o.node = "a";
  o.secret = "endpoint-test";
  auto inner = bulk::make_tcp_backend(o);
  REQUIRE(inner);
  bulk::fault_plan plan;
  plan.connect_delay = 1500ms;
  std::shared_ptr<bulk::backend> be_a =
      bulk::make_fault_backend(std::move(*inner), plan);
  auto be_b = tcp("b");
  std::vector<uint8_t> src(4096, 0x7b), dst(4096, 0);
  auto rs = be_a->register_region(src.data(), src.size());
  auto rd = be_b->register_region(dst.data(), dst.size());
  REQUIRE(rs);
  REQUIRE(rd);
  auto dir_a = std::make_shared<region_directory>();
  dir_a->add(*rs);
  {
    auto a = spawn_bulk_endpoint(sys, be_a, dir_a);
    auto b =
        spawn_bulk_endpoint(sys, be_b, std::make_shared<region_directory>());
    auto info_b = ask<endpoint_info>(self, b, describe_atom_v);
    auto t0 = std::chrono::steady_clock::now();
    self->send(a, connect_atom_v, info_b); // answered in 1.5 s
    // Meanwhile both endpoints answer at once.
    CHECK(ask<endpoint_info>(self, a, describe_atom_v).node == "a");
    CHECK(ask<endpoint_info>(self, b, describe_atom_v).node == "b");
    CHECK(std::chrono::steady_clock::now() - t0 < 1000ms);
    endpoint_info connected;
    self->receive([&](endpoint_info& x) { connected = std::move(x); },
                  [&](caf::error& err) { FAIL(caf::to_string(err)); },
                  caf::after(10s) >> [] { FAIL("no answer to connect"); });
    CHECK(std::chrono::steady_clock::now() - t0 >= 1500ms);
    CHECK(connected.node == "a");
    // And the connection it made carries bytes.
    write_batch wb;
    wb.tag = 9;
    wb.tclass = transport::traffic_class::kv;
    wb.ops.push_back(write_op{rs->id(), 0, rd->describe()});
    auto c = ask<batch_completion>(self, a, write_atom_v, wb);
    CHECK(!c.error);
    CHECK(dst == src);
    self->send_exit(a, caf::exit_reason::user_shutdown);
    self->send_exit(b, caf::exit_reason::user_shutdown);
  }
  dir_a->remove(rs->id());
}
