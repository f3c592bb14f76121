// The verbs backend's side channel: a TCP connection per (sender, receiver)
// pair that carries the authenticated connection handshake, then the
// receiver's region table on request and notices of removed regions, and
// whose end tells the sender at once that the receiver is gone.
//
// Frames: u32 length, u8 type, body (host byte order; both ends run the same
// build family). Handshake (client = the sending side):
//   server -> client  challenge {version, nonce_s, node_s, incarnation_s}
//   client -> server  hello {nonce_c, node_c, incarnation_c, qp_endpoint_c,
//                            mac}  mac = HMAC(secret, "c" nonce_s body)
//   server -> client  welcome {qp_endpoint_s, region table, mac}
//   (qp_endpoint: LID, MTU, GRH flag, GID, lane count 2..max_lanes, then
//   QPN and PSN per lane; the client chooses the count, the server makes as
//   many queue pairs and answers with the same count)
//                            mac = HMAC(secret, "s" nonce_c body), sent
//                            after the server's queue pairs reached RTR
//                     or refused {reason}
// Later: regions_req {} -> regions {table}; region_gone {id}.
// The MACs cover every byte of their message, so neither side accepts queue
// pair numbers or region keys from someone without the shared secret.
//
// Thread safety: value types and functions on one socket; a `channel` is
// used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "transport/bulk/verbs_call.hpp"
#include "transport/bulk/verbs_qp.hpp"

namespace dualpath::transport::bulk::verbs {

/// 2: a lane count and one queue pair per lane (was: one per class).
constexpr uint16_t wire_version = 2;
constexpr uint32_t max_frame_bytes = 4u << 20;
constexpr uint32_t max_regions = 65536;

enum class frame_type : uint8_t {
  challenge = 1,
  hello = 2,
  welcome = 3,
  refused = 4,
  regions_req = 5,
  regions = 6,
  region_gone = 7,
};

/// One region as its owner advertises it to authenticated peers.
struct region_entry {
  uint32_t id = 0;
  uint32_t rkey = 0;
  uint64_t key = 0;
  uint64_t base = 0;
  uint64_t length = 0;
};

/// Appends fields to a frame body.
class wire_writer {
public:
  void u8(uint8_t x) {
    buf_.push_back(x);
  }
  void u16(uint16_t x) {
    raw(&x, sizeof(x));
  }
  void u32(uint32_t x) {
    raw(&x, sizeof(x));
  }
  void u64(uint64_t x) {
    raw(&x, sizeof(x));
  }
  void raw(const void* p, size_t n);
  void text(const std::string& s); ///< u16 length + bytes
  void endpoint(const qp_endpoint& e);
  void table(const std::vector<region_entry>& t);
  /// Appends HMAC(secret, label | nonce | everything written so far).
  void seal(const std::string& secret, char label, const uint8_t nonce[32]);
  const std::vector<uint8_t>& bytes() const {
    return buf_;
  }

private:
  std::vector<uint8_t> buf_;
};

/// Reads fields of a frame body; any read past the end sets failed().
class wire_reader {
public:
  explicit wire_reader(const std::vector<uint8_t>& buf) : buf_(buf) {
    // nop
  }
  uint8_t u8();
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  void raw(void* p, size_t n);
  std::string text(size_t max_len);
  qp_endpoint endpoint();
  std::vector<region_entry> table();
  size_t position() const {
    return pos_;
  }
  bool failed() const {
    return failed_;
  }
  /// True if the body was read exactly to its end without failure.
  bool done() const {
    return !failed_ && pos_ == buf_.size();
  }

private:
  const std::vector<uint8_t>& buf_;
  size_t pos_ = 0;
  bool failed_ = false;
};

/// HMAC-SHA256(secret, label | nonce | body[0, len)).
void mac_of(const std::string& secret, char label, const uint8_t nonce[32],
            const uint8_t* body, size_t len, uint8_t out[32]);

/// Checks the 32-byte MAC that ends `body` (constant time).
bool mac_ok(const std::string& secret, char label, const uint8_t nonce[32],
            const std::vector<uint8_t>& body);

struct frame {
  frame_type type = frame_type::refused;
  std::vector<uint8_t> body;
};

/// A connected, non-blocking TCP socket speaking frames.
class channel {
public:
  channel() = default;
  explicit channel(unique_fd fd) : fd_(std::move(fd)) {
    // nop
  }

  /// Connects to host:port within `timeout` (errors: peer_lost).
  static caf::expected<channel> dial(const std::string& host, uint16_t port,
                                     std::chrono::milliseconds timeout);

  caf::error send(frame_type type, const std::vector<uint8_t>& body,
                  std::chrono::milliseconds timeout);
  /// Reads one frame within `timeout` (errors: peer_lost on EOF or
  /// timeout, bad_frame on an oversized or unknown frame).
  caf::expected<frame> receive(std::chrono::milliseconds timeout);

  int fd() const {
    return fd_.get();
  }
  explicit operator bool() const {
    return static_cast<bool>(fd_);
  }

private:
  caf::error io(bool write, uint8_t* p, size_t n,
                std::chrono::steady_clock::time_point until);
  unique_fd fd_;
};

/// A listening TCP socket (non-blocking accept).
struct listener {
  unique_fd fd;
  uint16_t port = 0;
  /// Listens on host:port (port 0: any free port).
  static caf::expected<listener> open(const std::string& host, uint16_t port);
  /// Accepts one pending connection; an empty channel when none is pending.
  caf::expected<channel> accept();
};

struct host_port {
  std::string host;
  uint16_t port = 0;
};

/// Parses "host:port" (errors: bad_frame naming `what`).
caf::expected<host_port> parse_host_port(const std::string& s,
                                         const std::string& what);

} // namespace dualpath::transport::bulk::verbs
