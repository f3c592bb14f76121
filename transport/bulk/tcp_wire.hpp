// Wire format of the tcp backend (host byte order; both ends run on the same
// architecture family, checked by the magic values). Plain packed structs so
// a frame header is read and validated before a single payload byte is.
//
// Thread safety: pure functions and value types.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "transport/types.hpp"

namespace dualpath::transport::bulk::wire {

constexpr uint32_t auth_magic = 0x44504831;  // "DPH1"
constexpr uint32_t frame_magic = 0x44505731; // "DPW1"
constexpr uint32_t ack_magic = 0x44504131;   // "DPA1"
constexpr uint16_t version = 1;
constexpr uint16_t flag_immediate = 1;

#pragma pack(push, 1)

/// Listener -> client right after accept.
struct challenge {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint8_t nonce[32];
};

/// Client -> listener: who it is, which class the connection carries, its
/// own nonce and HMAC(secret, server nonce | tclass | node).
struct hello {
  uint32_t magic;
  uint16_t version;
  uint8_t tclass;
  uint8_t reserved;
  uint8_t nonce[32];
  uint8_t mac[32];
  char node[64];
};

/// Listener -> client: status 0 and HMAC(secret, client nonce | "server").
struct welcome {
  uint32_t magic;
  uint8_t status;
  uint8_t reserved[3];
  uint8_t mac[32];
};

/// One write request; `length` payload bytes follow.
struct frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint32_t region_id;
  uint8_t tclass;
  uint8_t reserved[3];
  uint64_t key;
  uint64_t offset;
  uint64_t length;
  uint64_t seq;
  uint32_t immediate;
  uint32_t reserved2;
};

/// Receiver -> sender, one per frame, in order; status is a transport_errc.
struct ack {
  uint32_t magic;
  uint8_t status;
  uint8_t reserved[3];
  uint64_t seq;
};

#pragma pack(pop)

static_assert(sizeof(frame_header) == 56, "frame header layout");
static_assert(sizeof(ack) == 16, "ack layout");

inline frame_header make_header(uint32_t region, uint64_t key, uint64_t offset,
                                uint64_t length, traffic_class tc) {
  frame_header h{};
  h.magic = frame_magic;
  h.version = version;
  h.region_id = region;
  h.tclass = static_cast<uint8_t>(tc);
  h.key = key;
  h.offset = offset;
  h.length = length;
  return h;
}

inline void set_immediate(frame_header& h, uint32_t value) {
  h.flags |= flag_immediate;
  h.immediate = value;
}

inline void hmac(const std::string& secret, const uint8_t* data, size_t len,
                 uint8_t out[32]) {
  unsigned int out_len = 32;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), data, len,
       out, &out_len);
}

inline void client_mac_of(const std::string& secret, const uint8_t nonce[32],
                          const hello& h, uint8_t out[32]) {
  uint8_t msg[32 + 1 + sizeof(h.node)];
  std::memcpy(msg, nonce, 32);
  msg[32] = h.tclass;
  std::memcpy(msg + 33, h.node, sizeof(h.node));
  hmac(secret, msg, sizeof(msg), out);
}

inline void client_mac(const std::string& secret, const uint8_t nonce[32],
                       hello& h) {
  client_mac_of(secret, nonce, h, h.mac);
}

template <class Nonce>
bool client_mac_ok(const std::string& secret, const Nonce& nonce,
                   const hello& h) {
  uint8_t expected[32];
  client_mac_of(secret, nonce.data(), h, expected);
  return CRYPTO_memcmp(expected, h.mac, 32) == 0;
}

inline void server_mac_of(const std::string& secret, const uint8_t nonce[32],
                          uint8_t out[32]) {
  uint8_t msg[32 + 6];
  std::memcpy(msg, nonce, 32);
  std::memcpy(msg + 32, "server", 6);
  hmac(secret, msg, sizeof(msg), out);
}

inline void server_mac(const std::string& secret, const uint8_t nonce[32],
                       welcome& w) {
  server_mac_of(secret, nonce, w.mac);
}

inline bool server_mac_ok(const std::string& secret, const uint8_t nonce[32],
                          const welcome& w) {
  uint8_t expected[32];
  server_mac_of(secret, nonce, expected);
  return CRYPTO_memcmp(expected, w.mac, 32) == 0;
}

/// What one send system call of a frame carries, `sent` bytes of it (header
/// first) already out: the header's rest (`header` bytes from
/// `header_offset`), then `payload` bytes from `payload_offset`. The header
/// rides with the payload uncharged, so a payload goes in `budget`-sized
/// calls and a frame never ends in a header-sized call.
struct send_call {
  size_t header_offset = 0;
  size_t header = 0;
  uint64_t payload_offset = 0;
  uint64_t payload = 0;
};

/// The next send_call of a frame of `length` payload bytes; `sent` is less
/// than sizeof(frame_header) + length.
inline send_call next_send_call(uint64_t sent, uint64_t length,
                                uint64_t budget) {
  send_call c;
  if (sent < sizeof(frame_header)) {
    c.header_offset = static_cast<size_t>(sent);
    c.header = sizeof(frame_header) - c.header_offset;
  } else {
    c.payload_offset = sent - sizeof(frame_header);
  }
  c.payload = std::min(length - c.payload_offset, budget);
  return c;
}

/// The frame header in the first `len` received bytes, if they hold one that
/// the receiver accepts: this magic and version, no unknown flag, a payload
/// of at most `max_payload` bytes. Anything else means the stream can no
/// longer be trusted to be framed. (The region, key and bounds are the
/// region table's to check.)
inline std::optional<frame_header>
parse_frame_header(const uint8_t* data, size_t len, uint64_t max_payload) {
  if (len < sizeof(frame_header))
    return std::nullopt;
  frame_header h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != frame_magic || h.version != version
      || (h.flags & ~flag_immediate) != 0 || h.length > max_payload)
    return std::nullopt;
  return h;
}

/// The client's hello in the first `len` received bytes, if it is one from a
/// peer that knows `secret` (it answers the listener's `nonce`) for a known
/// traffic class; its node name is NUL-terminated.
template <class Nonce>
std::optional<hello> parse_hello(const uint8_t* data, size_t len,
                                 const std::string& secret,
                                 const Nonce& nonce) {
  if (len < sizeof(hello))
    return std::nullopt;
  hello h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != auth_magic || h.version != version
      || h.tclass >= traffic_class_count || !client_mac_ok(secret, nonce, h))
    return std::nullopt;
  h.node[sizeof(h.node) - 1] = 0;
  return h;
}

} // namespace dualpath::transport::bulk::wire
