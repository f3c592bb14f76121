// ctest-label: observability
// The metrics endpoint's HTTP server: GET and HEAD of known paths; malformed,
// oversized and wrong requests are refused with 400/404/405/413/414/431/501/
// 505 (and a silent client with 408) and the server keeps serving
// afterwards; idle and slow clients never delay a scrape.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/observe/http_server.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::actors::observe;

namespace {

using dualpath::test::read_to_end;

int connect_to(uint16_t port) {
  int fd = dualpath::test::connect_loopback(port);
  REQUIRE(fd >= 0);
  return fd;
}

// Sends `request` (then half-closes unless `half_close` is false) and returns
// the whole answer.
std::string exchange(uint16_t port, const std::string& request,
                     bool half_close = true) {
  int fd = connect_to(port);
  size_t off = 0;
  while (off < request.size()) {
    auto n =
        ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      break; // the server may answer and close before reading everything
    off += static_cast<size_t>(n);
  }
  if (half_close)
    ::shutdown(fd, SHUT_WR);
  auto out = read_to_end(fd);
  ::close(fd);
  return out;
}

int status_of(const std::string& answer) {
  if (answer.compare(0, 9, "HTTP/1.1 ") != 0)
    return -1;
  return std::stoi(answer.substr(9, 3));
}

struct fixture {
  fixture() {
    http_limits limits;
    limits.read_timeout = std::chrono::milliseconds(500);
    limits.max_header_bytes = 8192;
    std::map<std::string, http_server::route> routes;
    routes["/metrics"] = [] {
      return http_response{200, "text/plain; version=0.0.4", "up 1\n"};
    };
    auto s = http_server::make("127.0.0.1", 0, std::move(routes), limits);
    REQUIRE(s);
    server = std::move(*s);
  }
  std::unique_ptr<http_server> server;
};

const std::string host = "Host: localhost\r\n";

} // namespace

TEST_CASE_FIXTURE(fixture, "GET and HEAD of /metrics") {
  auto get =
      exchange(server->port(), "GET /metrics HTTP/1.1\r\n" + host + "\r\n");
  CHECK(status_of(get) == 200);
  CHECK(get.find("Content-Type: text/plain; version=0.0.4")
        != std::string::npos);
  CHECK(get.substr(get.size() - 5) == "up 1\n");
  auto query = exchange(server->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  CHECK(status_of(query) == 200);
  auto head =
      exchange(server->port(), "HEAD /metrics HTTP/1.1\r\n" + host + "\r\n");
  CHECK(status_of(head) == 200);
  CHECK(head.find("up 1") == std::string::npos);
  CHECK(head.find("Content-Length: 5") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "wrong and malformed requests are refused") {
  struct item {
    std::string request;
    int status;
  };
  std::vector<item> items{
      {"GET /nope HTTP/1.1\r\n" + host + "\r\n", 404},
      {"POST /metrics HTTP/1.1\r\n" + host + "Content-Length: 0\r\n\r\n", 405},
      {"DELETE /metrics HTTP/1.1\r\n" + host + "\r\n", 405},
      {"GET metrics HTTP/1.1\r\n" + host + "\r\n", 400},
      {"GET /metrics HTTP/1.1\r\n\r\n", 400}, // no Host
      {"GET /metrics HTTP/1.1\r\n" + host + "Bad Header\r\n\r\n", 400},
      {"GET /metrics HTTP/1.1\r\n" + host + host + "\r\n", 400}, // two
      {"GET /metrics HTTP/1.1\r\n" + host + "Content-Length: x\r\n\r\n", 400},
      {"GET /metrics HTTP/9.9\r\n" + host + "\r\n", 505},
      {"GET /metrics HTTP/1.1\r\n" + host + "Content-Length: 999999\r\n\r\n",
       413},
      {"GET /metrics HTTP/1.1\r\n" + host
           + "Transfer-Encoding: chunked\r\n\r\n",
       501},
      {"GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n" + host + "\r\n",
       414},
      {"GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(20000, 'b')
           + "\r\n\r\n",
       431},
      {"GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(9000, 'b')
           + "\r\n\r\n",
       431}, // larger than the limit, smaller than the library's pool
  };
  for (auto& x : items) {
    CAPTURE(x.request.substr(0, 60));
    auto answer = exchange(server->port(), x.request);
    CHECK(status_of(answer) == x.status);
    CHECK(answer.find("Connection: close") != std::string::npos);
  }
  CHECK(server->refused() >= 10); // the others the library refuses itself
  // Input that is not HTTP at all: closed without an answer.
  for (auto& x :
       {std::string{"GARBAGE\r\n\r\n"},
        std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)
            + "\r\n\r\n"}) {
    auto answer = exchange(server->port(), x);
    CHECK(answer.find("200 OK") == std::string::npos);
  }
  // Still serving.
  auto ok =
      exchange(server->port(), "GET /metrics HTTP/1.1\r\n" + host + "\r\n");
  CHECK(status_of(ok) == 200);
}

TEST_CASE_FIXTURE(fixture, "a silent client is dropped, others are served") {
  int idle = connect_to(server->port());
  // An incomplete request that never ends: 408 after the read timeout.
  auto start = std::chrono::steady_clock::now();
  auto answer = exchange(server->port(), "GET /metrics HTTP/1.1\r\n", false);
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(status_of(answer) == 408);
  CHECK(waited >= std::chrono::milliseconds(450));
  CHECK(waited < std::chrono::seconds(2));
  ::close(idle);
  auto ok =
      exchange(server->port(), "GET /metrics HTTP/1.1\r\n" + host + "\r\n");
  CHECK(status_of(ok) == 200);
}

TEST_CASE_FIXTURE(fixture, "50 idle connections do not delay a scrape") {
  // Connections that sent nothing or one byte of a head, all open at once.
  std::vector<int> idle;
  for (int i = 0; i < 50; ++i) {
    idle.push_back(connect_to(server->port()));
    if (i % 2 == 0)
      CHECK(::send(idle.back(), "G", 1, MSG_NOSIGNAL) == 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto start = std::chrono::steady_clock::now();
  auto ok =
      exchange(server->port(), "GET /metrics HTTP/1.1\r\n" + host + "\r\n");
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(status_of(ok) == 200);
  CHECK(waited < std::chrono::seconds(1));
  // A client sending its head one byte at a time does not delay one either.
  int slow = connect_to(server->port());
  CHECK(::send(slow, "GET /met", 8, MSG_NOSIGNAL) == 8);
  start = std::chrono::steady_clock::now();
  ok = exchange(server->port(), "GET /metrics HTTP/1.1\r\n" + host + "\r\n");
  CHECK(status_of(ok) == 200);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  // Each idle one gets its 408 at the head deadline, then the close.
  for (auto fd : idle) {
    CHECK(status_of(read_to_end(fd)) == 408);
    ::close(fd);
  }
  ::close(slow);
}

TEST_CASE("the server releases its port and sockets") {
  uint16_t port = 0;
  for (int i = 0; i < 3; ++i) {
    auto s = http_server::make("127.0.0.1", port, {});
    REQUIRE(s);
    port = (*s)->port(); // the same port again: the last one closed it
  }
  auto bad = http_server::make("127.0.0.1.5", 0, {});
  CHECK(!bad);
}
