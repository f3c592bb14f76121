// libFuzzer target: the metrics endpoint's request handling
// (actors/observe/http_server.hpp: libmicrohttpd's parser and the server's
// own checks), over a real loopback connection per input. Whatever the
// bytes, the server answers with one of its statuses or closes, and keeps
// serving.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/observe/http_server.hpp"

using namespace dualpath::actors::observe;

namespace {

http_server& server() {
  static auto srv = [] {
    std::map<std::string, http_server::route> routes;
    routes["/metrics"] = [] {
      return http_response{200, "text/plain; version=0.0.4", "up 1\n"};
    };
    routes["/"] = [] { return http_response{200, "text/plain", "root\n"}; };
    http_limits limits;
    // Short, so that the many incomplete heads a fuzzer makes get their 408
    // quickly; the deadline logic runs all the same.
    limits.read_timeout = std::chrono::milliseconds(20);
    auto s = http_server::make("127.0.0.1", 0, std::move(routes), limits);
    if (!s)
      std::abort();
    return std::move(*s);
  }();
  return *srv;
}

bool known_status(int s) {
  switch (s) {
    case 200:
    case 400:
    case 404:
    case 405:
    case 408:
    case 413:
    case 414:
    case 431:
    case 501:
    case 505:
      return true;
    default:
      return false;
  }
}

// Whether `fd` has `events` before `deadline`; a poll that libFuzzer's
// once-a-second timer interrupts is resumed.
bool ready_before(int fd, short events,
                  std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    pollfd p{fd, events, 0};
    auto ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (ready < 0 && errno == EINTR)
      continue;
    return ready > 0;
  }
}

// A blocking connect() that a signal interrupted (libFuzzer's timer ticks
// every second; a loopback connect waits when the server's accept queue is
// full and the SYN is retried) goes on in the background: waits up to 5 s
// for it and takes its outcome. False with errno set when it failed.
bool connected_after_interrupt(int fd, int err) {
  if (err != EINTR) {
    errno = err;
    return false;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  if (!ready_before(fd, POLLOUT, deadline)) {
    errno = ETIMEDOUT;
    return false;
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0)
    return false;
  errno = so_error;
  return so_error == 0;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& srv = server();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(srv.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
      && !connected_after_interrupt(fd, errno)) {
    // Say why: a refused connect means the server stopped listening (a
    // finding), a local errno (EADDRNOTAVAIL, EMFILE) the host ran out.
    std::fprintf(stderr, "fuzz_http_request: connect to 127.0.0.1:%u: %s\n",
                 static_cast<unsigned>(srv.port()), std::strerror(errno));
    std::abort();
  }
  // The server may answer and close before reading everything.
  size_t off = 0;
  while (off < size) {
    auto n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    if (!ready_before(fd, POLLIN, deadline))
      __builtin_trap(); // neither an answer nor a close within 5 s
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (answer.empty())
    return 0; // closed without an answer: not HTTP at all
  if (answer.compare(0, 9, "HTTP/1.1 ") != 0 || answer.size() < 12
      || !known_status(std::atoi(answer.substr(9, 3).c_str())))
    __builtin_trap();
  return 0;
}
