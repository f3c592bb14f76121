// ctest-label: transport
// The verbs handshake's endpoint encoding: a queue pair per lane, and the
// lane count a peer may ask for (pure bytes: runs without an RDMA device).
#include <doctest/doctest.h>

#include <infiniband/verbs.h>

#include <vector>

#include "transport/bulk/verbs_wire.hpp"

using namespace dualpath::transport::bulk;
using namespace dualpath::transport::bulk::verbs;

namespace {

qp_endpoint sample(uint8_t lanes) {
  qp_endpoint e;
  e.address.lid = 7;
  e.address.mtu = IBV_MTU_1024;
  e.address.global = true;
  for (uint8_t i = 0; i < 16; ++i)
    e.address.gid[i] = i;
  e.lanes = lanes;
  for (size_t l = 0; l < max_lanes; ++l) {
    e.qpn[l] = 100 + static_cast<uint32_t>(l);
    e.psn[l] = 200 + static_cast<uint32_t>(l);
  }
  return e;
}

/// An endpoint claiming `lanes` lanes, followed by as many (qpn, psn)
/// pairs as it claims (max_lanes at most: the writer stops there).
std::vector<uint8_t> encoded(uint8_t lanes) {
  wire_writer w;
  w.endpoint(sample(lanes));
  return w.bytes();
}

} // namespace

TEST_CASE("an endpoint of every allowed lane count reads back as written") {
  for (uint8_t lanes = 2; lanes <= max_lanes; ++lanes) {
    CAPTURE(int{lanes});
    auto bytes = encoded(lanes);
    wire_reader r{bytes};
    auto e = r.endpoint();
    REQUIRE(r.done());
    CHECK(e.lanes == lanes);
    CHECK(e.address.lid == 7);
    CHECK(e.address.mtu == IBV_MTU_1024);
    for (size_t l = 0; l < lanes; ++l) {
      CHECK(e.qpn[l] == 100 + l);
      CHECK(e.psn[l] == 200 + l);
    }
  }
}

TEST_CASE("a lane count outside 2..max_lanes is refused before any queue "
          "pair would be made for it") {
  // 0 and 1: no KV lane; max_lanes + 1 and 255: more queue pairs than a
  // receiver makes (the bytes after the count are whatever a hostile peer
  // sends: here as many as max_lanes lanes would take).
  for (int lanes : {0, 1, static_cast<int>(max_lanes) + 1, 255}) {
    CAPTURE(lanes);
    auto bytes = encoded(static_cast<uint8_t>(lanes));
    wire_reader r{bytes};
    auto e = r.endpoint();
    CHECK(r.failed());
    CHECK(e.lanes == 0);
  }
}

TEST_CASE("an endpoint cut short is refused") {
  auto bytes = encoded(3);
  bytes.resize(bytes.size() - 1);
  wire_reader r{bytes};
  static_cast<void>(r.endpoint());
  CHECK(!r.done());
}
