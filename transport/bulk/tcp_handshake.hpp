// The tcp backend's authenticated handshake (wire structs in tcp_wire.hpp).
// The listener sends a challenge with a fresh nonce; the client answers with
// its node name, the connection's traffic class, its own nonce and
// HMAC-SHA256(secret, listener nonce | class | node); the listener answers with
// HMAC(secret, client nonce | "server"), so each side proves it holds the
// shared secret without sending it, and a replayed hello fails against a new
// nonce.
//
// The client side is blocking (bounded by the io timeout, run on a sender
// thread); the listener side is split into pure steps so the non-blocking
// receive loop can drive it.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <caf/expected.hpp>

#include "transport/bulk/tcp_socket.hpp"
#include "transport/bulk/tcp_wire.hpp"
#include "transport/types.hpp"

namespace dualpath::transport::bulk {

/// Who dials whom, and with which credentials.
struct dial_request {
  std::string host;
  uint16_t port = 0;
  traffic_class tclass = traffic_class::kv;
  std::string node; ///< Our node name, sent in the hello.
  std::string secret;
  std::chrono::milliseconds io_timeout{2000};
};

/// Connects and authenticates. The result is non-blocking with
/// TCP_NODELAY set. Errors: system_error (a call failed), peer_lost
/// (unreachable, closed, timed out), unauthenticated (refused or failed to
/// prove the secret), bad_config (host is not an IPv4 address).
caf::expected<unique_fd> dial(const dial_request& req);

using nonce = std::array<uint8_t, 32>;

/// The listener's first message; its nonce is stored in `out`.
wire::challenge make_challenge(nonce& out);

/// A client that proved the secret.
struct authenticated_peer {
  std::string node;
  traffic_class tclass = traffic_class::control;
  wire::welcome reply{}; ///< To send back (status 0, our proof).
};

/// Checks a hello against the challenge's nonce. Fails with unauthenticated
/// on a bad magic, version, class or MAC.
caf::expected<authenticated_peer>
check_hello(const std::string& secret, const nonce& sent, const wire::hello& h);

/// The welcome that tells a client it was refused.
wire::welcome refusal();

} // namespace dualpath::transport::bulk
