// The metrics endpoint's HTTP/1.1 server, on GNU libmicrohttpd (Debian's
// libmicrohttpd-dev). It serves GET and HEAD of a fixed set of paths, one
// request per connection (`Connection: close`).
//
// Why libmicrohttpd (and not cpp-httplib or civetweb): it is event-driven.
// One thread multiplexes every connection through epoll, so an idle or slow
// client costs a socket and a small bounded memory pool, never a worker
// thread; cpp-httplib and civetweb give each connection a pool thread for as
// long as it is open, so as many idle clients as there are threads delay a
// scrape until their deadlines pass (the failure this server replaces). It
// bounds connections, per-connection memory and per-connection time by
// option, and it runs in "external polling" mode, so the server keeps its own
// thread and loop and adds what the library lacks (the 408 below).
//
// Concurrency and deadlines: up to `max_connections` connections are open at
// once; each must deliver its complete request head within `read_timeout`
// (else it gets 408 and is closed), and the whole connection, answer
// included, is dropped `read_timeout` + 1 s after it was opened at the
// latest. Idle or slow clients therefore never delay other clients.
//
// Bounded input and the answers: a request line longer than
// max_request_line: 414; a head larger than max_header_bytes: 431; a
// Content-Length larger than max_body_bytes: 413; a transfer coding: 501;
// malformed requests (bad Content-Length, header line without a colon,
// HTTP/1.1 without exactly one Host, a target that is not an absolute path):
// 400; an unknown path: 404; another method: 405; another protocol version:
// 505. Input the library cannot read as HTTP at all (a request line without
// spaces, binary such as a TLS ClientHello) gets the connection closed
// without an answer. The library accepts the obsolete forms RFC 9112 lets a
// server accept (several spaces between the request line's parts, folded
// header lines replaced by a space).
//
// Ownership: the server owns its listening socket, the daemon and its
// thread; the destructor stops the thread, then the daemon (RAII).
// Thread safety: routes run on the server's thread, one at a time; they must
// be thread-safe with respect to the rest of the program. port(), served()
// and refused() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <caf/expected.hpp>

namespace dualpath::actors::observe {

/// Input, connection and time limits of the server.
struct http_limits {
  size_t max_request_line = 4096;  ///< Longer target: 414 URI Too Long.
  size_t max_header_bytes = 16384; ///< Request line + headers; larger: 431.
  size_t max_body_bytes = 1024;    ///< Larger Content-Length: 413.
  /// The complete request head must arrive within this (else 408).
  std::chrono::milliseconds read_timeout{2000};
  /// Connections open at once; more are closed on accept.
  unsigned max_connections = 256;
};

/// What a route returns.
struct http_response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class http_server {
public:
  using route = std::function<http_response()>;

  /// Binds `address:port` (port 0: an ephemeral port, see port()) and
  /// starts serving `routes` (path -> handler). Fails with
  /// caf::sec::cannot_open_port naming the failed call and errno.
  static caf::expected<std::unique_ptr<http_server>>
  make(const std::string& address, uint16_t port,
       std::map<std::string, route> routes, http_limits limits = {});

  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The port the server listens on.
  uint16_t port() const {
    return port_;
  }

  /// Requests answered so far (any status; a 408 counts).
  uint64_t served() const {
    return served_.load();
  }

  /// Requests refused with a 4xx/5xx status so far.
  uint64_t refused() const {
    return refused_.load();
  }

  struct impl; // the daemon and the per-connection state (http_server.cpp)

private:
  http_server(std::unique_ptr<impl> state, uint16_t port, int wake_fd);

  void loop();

  std::unique_ptr<impl> impl_;
  uint16_t port_ = 0;
  int wake_fd_ = -1; // eventfd: wakes the loop on destruction
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

} // namespace dualpath::actors::observe
