// ctest-label: transport
// The listener half of the tcp handshake as pure steps: a hello made with the
// secret over this challenge's nonce passes and yields the node, class and a
// proof the client accepts; a wrong secret, a replay against a fresh nonce,
// a tampered class or node, and bad magic or version are refused.
#include <doctest/doctest.h>

#include <cstring>

#include "transport/bulk/tcp_handshake.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;

namespace {

wire::hello hello_for(const std::string& secret, const wire::challenge& ch,
                      traffic_class tc, const char* node) {
  wire::hello h{};
  h.magic = wire::auth_magic;
  h.version = wire::version;
  h.tclass = static_cast<uint8_t>(tc);
  std::strncpy(h.node, node, sizeof(h.node) - 1);
  for (size_t i = 0; i < sizeof(h.nonce); ++i)
    h.nonce[i] = static_cast<uint8_t>(i * 7);
  wire::client_mac(secret, ch.nonce, h);
  return h;
}

bool refused(const caf::expected<authenticated_peer>& x) {
  return !x
         && static_cast<transport_errc>(x.error().code())
                == transport_errc::unauthenticated;
}

} // namespace

TEST_CASE("a hello with the secret over this nonce is accepted both ways") {
  nonce sent;
  auto ch = make_challenge(sent);
  CHECK(ch.magic == wire::auth_magic);
  CHECK(std::memcmp(ch.nonce, sent.data(), sent.size()) == 0);
  auto h = hello_for("s", ch, traffic_class::kv, "node-7");
  auto p = check_hello("s", sent, h);
  REQUIRE(p);
  CHECK(p->node == "node-7");
  CHECK(p->tclass == traffic_class::kv);
  CHECK(p->reply.status == 0);
  CHECK(wire::server_mac_ok("s", h.nonce, p->reply));
  CHECK(!wire::server_mac_ok("other", h.nonce, p->reply));
}

TEST_CASE("wrong secret, replay, tampering and bad framing are refused") {
  nonce sent;
  auto ch = make_challenge(sent);
  auto good = hello_for("s", ch, traffic_class::control, "a");
  CHECK(refused(
      check_hello("s", sent, hello_for("x", ch, traffic_class::control, "a"))));
  nonce fresh;
  make_challenge(fresh);
  CHECK(fresh != sent);
  CHECK(refused(check_hello("s", fresh, good))); // replayed hello
  auto tampered = good;
  tampered.tclass = static_cast<uint8_t>(traffic_class::kv);
  CHECK(refused(check_hello("s", sent, tampered)));
  tampered = good;
  tampered.node[0] = 'b';
  CHECK(refused(check_hello("s", sent, tampered)));
  tampered = good;
  tampered.tclass = 7;
  CHECK(refused(check_hello("s", sent, tampered)));
  tampered = good;
  tampered.magic ^= 1;
  CHECK(refused(check_hello("s", sent, tampered)));
  tampered = good;
  tampered.version += 1;
  CHECK(refused(check_hello("s", sent, tampered)));
  auto no = refusal();
  CHECK(no.status == static_cast<uint8_t>(transport_errc::unauthenticated));
}

TEST_CASE("dialling a host that is not an IPv4 address is bad_config") {
  dial_request req;
  req.host = "not-an-address";
  req.port = 1;
  req.node = "a";
  req.secret = "s";
  auto fd = dial(req);
  REQUIRE(!fd);
  CHECK(static_cast<transport_errc>(fd.error().code())
        == transport_errc::bad_config);
}
