// A small HTTP/1.1 server for the metrics endpoint: plain POSIX sockets and
// one thread of its own, so a slow or hostile client never runs on an actor
// thread. It serves GET and HEAD of a fixed set of paths and answers one
// request per connection (`Connection: close`).
//
// Bounded input: the request line and the header block are limited in size
// (414 / 431), a request body larger than the limit gets 413, a malformed
// request 400, an unknown path 404, another method 405, another protocol
// version 505; a client that does not send a complete header block within
// the read timeout is dropped. Connections are served one after another, so
// memory stays bounded whatever clients do.
//
// parse_request() is the pure parser (tested without sockets).
//
// Ownership: the server owns its listening socket and thread; the destructor
// stops the thread and closes the socket (RAII).
// Thread safety: handlers run on the server's thread; they must be
// thread-safe with respect to the rest of the program.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

namespace dualpath::actors::observe {

/// Input limits of the server.
struct http_limits {
  size_t max_request_line = 4096;  ///< Longer: 414 URI Too Long.
  size_t max_header_bytes = 16384; ///< Request line + headers; longer: 431.
  size_t max_body_bytes = 1024;    ///< Larger Content-Length: 413.
  std::chrono::milliseconds read_timeout{2000};
};

/// A parsed request head.
struct http_request {
  std::string method;
  std::string target; ///< As sent (path and query).
  std::string path;   ///< Target without the query.
  std::string version;
  std::vector<std::pair<std::string, std::string>> headers; ///< Names lowered.
  uint64_t content_length = 0;
};

/// Outcome of parsing a request head: status 0 = well-formed, else the
/// error status to answer with and why.
struct http_parse_result {
  int status = 0;
  std::string reason;
  http_request request;
};

/// Parses a request head (request line and header lines, each ending in
/// CRLF, without the final empty line) against `limits`.
http_parse_result parse_request(const std::string& head,
                                const http_limits& limits);

/// What a route returns.
struct http_response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

/// Renders a complete response (status line, headers, body unless `head`).
std::string render_response(const http_response& r, bool head_only,
                            const std::string& extra_headers = {});

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

  /// Requests answered so far (any status).
  uint64_t served() const {
    return served_.load();
  }

  /// Requests refused with a 4xx/5xx status so far.
  uint64_t refused() const {
    return refused_.load();
  }

private:
  http_server(int listen_fd, int wake_fd, uint16_t port,
              std::map<std::string, route> routes, http_limits limits);

  void loop();
  void serve(int fd);

  int listen_fd_ = -1;
  int wake_fd_ = -1; // eventfd: wakes the loop on destruction
  uint16_t port_ = 0;
  std::map<std::string, route> routes_;
  http_limits limits_;
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

} // namespace dualpath::actors::observe
