// ctest-label: transport
// The tcp backend's framing helpers: how a frame is cut into send calls.
// (What a receiver accepts from the wire is fuzz/tcp_frames.cpp's and
// tests/transport/bulk/tcp_backend.cpp's.)
#include <doctest/doctest.h>

#include <vector>

#include "transport/bulk/tcp_wire.hpp"

using namespace dualpath::transport::bulk;

namespace {

constexpr uint64_t hdr = sizeof(wire::frame_header);

/// Every call of a frame of `length` payload bytes at `budget`, each sent
/// whole.
std::vector<wire::send_call> calls_of(uint64_t length, uint64_t budget) {
  std::vector<wire::send_call> out;
  uint64_t sent = 0;
  while (sent < hdr + length) {
    out.push_back(wire::next_send_call(sent, length, budget));
    sent += out.back().header + out.back().payload;
  }
  return out;
}

} // namespace

TEST_CASE("a frame goes in budget-sized payload calls, the header riding "
          "with the first, never a header-sized tail") {
  auto calls = calls_of(1 << 20, 256 << 10);
  REQUIRE(calls.size() == 4);
  CHECK(calls[0].header == hdr);
  CHECK(calls[0].header_offset == 0);
  uint64_t next = 0;
  for (const auto& c : calls) {
    CHECK(c.payload == 256 << 10);
    CHECK(c.payload_offset == next);
    next += c.payload;
  }
  for (size_t i = 1; i < calls.size(); ++i)
    CHECK(calls[i].header == 0);
  // A payload that is not a multiple of the budget ends in its remainder.
  calls = calls_of((1 << 20) + 100, 256 << 10);
  REQUIRE(calls.size() == 5);
  CHECK(calls.back().payload == 100);
  // An empty payload: one call, the header alone.
  calls = calls_of(0, 256 << 10);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].header == hdr);
  CHECK(calls[0].payload == 0);
}

TEST_CASE("a call after a partly sent header finishes the header first") {
  // The kernel took 10 header bytes of the last call.
  auto c = wire::next_send_call(10, 4096, 1024);
  CHECK(c.header_offset == 10);
  CHECK(c.header == hdr - 10);
  CHECK(c.payload_offset == 0);
  CHECK(c.payload == 1024);
  // ... and 10 payload bytes past the header.
  c = wire::next_send_call(hdr + 10, 4096, 1024);
  CHECK(c.header == 0);
  CHECK(c.payload_offset == 10);
  CHECK(c.payload == 1024);
  c = wire::next_send_call(hdr + 4000, 4096, 1024);
  CHECK(c.payload == 96);
}
