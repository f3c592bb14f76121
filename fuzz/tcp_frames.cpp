// libFuzzer target: the tcp backend's wire parsing
// (transport/bulk/tcp_wire.hpp), fed as a receiver sees a stream: a hello,
// then frame headers each followed by its payload. Whatever the bytes, a
// hello is accepted only with the right MAC, and an accepted frame header
// has the magic, the version, known flags and a bounded length.
#include <cstddef>
#include <cstdint>

#include <array>

#include "transport/bulk/tcp_wire.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string secret = "fuzz-secret";
  std::array<uint8_t, 32> nonce{};
  for (size_t i = 0; i < nonce.size(); ++i)
    nonce[i] = static_cast<uint8_t>(i * 7);
  // The first byte picks the stream's start: a hello (as the listener reads
  // it), or frames right away (as an authenticated connection goes on).
  if (size == 0)
    return 0;
  bool with_hello = (data[0] & 1) != 0;
  ++data;
  --size;
  if (with_hello) {
    auto h = wire::parse_hello(data, size, secret, nonce);
    if (!h)
      return 0;
    uint8_t expected[32];
    wire::client_mac_of(secret, nonce.data(), *h, expected);
    if (std::memcmp(expected, h->mac, 32) != 0
        || h->tclass >= traffic_class_count
        || h->node[sizeof(h->node) - 1] != 0)
      __builtin_trap();
    data += sizeof(wire::hello);
    size -= sizeof(wire::hello);
  }
  constexpr uint64_t max_payload = 1 << 16;
  while (size > 0) {
    auto h = wire::parse_frame_header(data, size, max_payload);
    if (!h)
      return 0; // the receiver drops the connection
    if (h->magic != wire::frame_magic || h->version != wire::version
        || h->length > max_payload || (h->flags & ~wire::flag_immediate) != 0)
      __builtin_trap();
    size_t step = sizeof(wire::frame_header);
    if (size - step < h->length)
      return 0; // the payload has not arrived (yet)
    step += h->length;
    data += step;
    size -= step;
  }
  return 0;
}
