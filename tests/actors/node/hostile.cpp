// ctest-label: distribution
// Hostile input against a running deployment (TLS, four processes on
// 127.0.0.1): garbage, an oversized TLS record, TLS clients without a
// certificate or with one of another CA on the scheduler's CAF port; garbage,
// a failed handshake, an oversized frame and writes with a wrong key on a
// prefill node's bulk port. Each is refused; afterwards every node is still in
// the cluster and a job runs with every block verified.
#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "tests/actors/node/deployment.hpp"
#include "tests/transport/bulk/raw_client.hpp"
#include "transport/bulk/tcp_wire.hpp"

using namespace dualpath::test;
namespace wire = dualpath::transport::bulk::wire;

namespace {

int connect_to(uint16_t port) {
  int fd = connect_loopback(port);
  REQUIRE(fd >= 0);
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `bytes` (as much as the peer takes) and reports whether the peer
// closed the connection within the receive timeout.
bool refused_after(int fd, const std::vector<uint8_t>& bytes) {
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[512];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
      return true;
    if (n < 0)
      return false; // timed out: still open
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<uint8_t> out(n);
  for (auto& x : out)
    x = static_cast<uint8_t>(rng());
  return out;
}

// The client side of the bulk handshake with `secret`; true if welcomed.
bool bulk_auth(int fd, const std::string& secret) {
  return raw_bulk_auth(fd, secret, "intruder");
}

const std::string secret = "test-secret-0123456789abcdef";

} // namespace

TEST_CASE("hostile peers on the CAF and bulk ports are refused; the nodes "
          "keep serving") {
  temp_dir dir;
  if (!make_test_ca(dir.path()))
    skip_suite("distribution.hostile", "the openssl command failed");
  // A second, unrelated CA and a certificate it signed.
  temp_dir other;
  REQUIRE(make_test_ca(other.path()));
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  write_file(cluster, cluster_toml(ports, dir.file("store"), true));
  auto settings = deployment_settings(4, 1, 20);
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());

  { // the CAF port
    // Garbage instead of a TLS handshake.
    int fd = connect_to(ports.caf);
    CHECK(refused_after(fd, random_bytes(100'000, 1)));
    ::close(fd);
    // A TLS record header announcing the largest record, then filler.
    fd = connect_to(ports.caf);
    std::vector<uint8_t> big{0x16, 0x03, 0x01, 0xff, 0xff};
    big.resize(70'000, 0);
    CHECK(refused_after(fd, big));
    ::close(fd);
    // TLS without a client certificate, and with one of another CA.
    auto target = " -connect 127.0.0.1:" + std::to_string(ports.caf);
    shell("openssl s_client" + target + " </dev/null >/dev/null 2>&1");
    shell("openssl s_client" + target + " -cert '" + other.file("node.pem")
          + "' -key '" + other.file("node.key") + "' -CAfile '"
          + dir.file("ca.pem") + "' </dev/null >/dev/null 2>&1");
    // A certificate of the right CA but no BASP handshake: just idle bytes.
    shell("printf 'hello' | openssl s_client" + target + " -cert '"
          + dir.file("node.pem") + "' -key '" + dir.file("node.key")
          + "' -CAfile '" + dir.file("ca.pem") + "' >/dev/null 2>&1");
  }
  { // the bulk port
    // Garbage instead of the hello.
    int fd = connect_to(ports.bulk_pe0);
    CHECK(refused_after(fd, random_bytes(100'000, 2)));
    ::close(fd);
    // The handshake with a wrong secret.
    fd = connect_to(ports.bulk_pe0);
    CHECK_FALSE(bulk_auth(fd, "not-the-secret-at-all"));
    CHECK(refused_after(fd, {}));
    ::close(fd);
    // An authenticated peer sending an oversized frame, then one with a
    // wrong key: both refused before any payload lands.
    fd = connect_to(ports.bulk_pe0);
    REQUIRE(bulk_auth(fd, secret));
    auto h = wire::make_header(1, 0x1234, 0, uint64_t{1} << 34,
                               dualpath::transport::traffic_class::kv);
    std::vector<uint8_t> frame(sizeof(h));
    std::memcpy(frame.data(), &h, sizeof(h));
    frame.resize(frame.size() + 65'536, 0x99);
    CHECK(refused_after(fd, frame));
    ::close(fd);
    fd = connect_to(ports.bulk_pe0);
    REQUIRE(bulk_auth(fd, secret));
    h = wire::make_header(1, 0x1234, 0, 4096,
                          dualpath::transport::traffic_class::kv);
    frame.assign(sizeof(h), 0);
    std::memcpy(frame.data(), &h, sizeof(h));
    frame.resize(frame.size() + 4096, 0x99);
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  // Every node is still up and joined, and a job runs on them.
  for (size_t i = 0; i < 4; ++i)
    CHECK(d.node(i).running());
  auto res = run_process([&] {
    std::vector<std::string> argv{dualpath_binary(), "run",       "--quiet",
                                  "--json",          "--cluster", cluster};
    argv.insert(argv.end(), settings.begin(), settings.end());
    return argv;
  }());
  REQUIRE_MESSAGE(res.status == 0, (res.err + d.logs()));
  auto doc = nlohmann::json::parse(res.out);
  auto got = doc["modes"]["dualpath"];
  CHECK(got["requests"].get<int>() == 4);
  CHECK(got["failed_requests"] == 0);
  CHECK(got["verify_failures"] == 0);
  CHECK(got["blocks_verified"].get<uint64_t>() > 0);
  CHECK(d.logs().find("left the cluster") == std::string::npos);
  CHECK(d.logs().find("lost") == std::string::npos);
}
