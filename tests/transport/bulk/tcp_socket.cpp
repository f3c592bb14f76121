// ctest-label: transport
// The tcp backend's checked system calls on real descriptors: a failing call
// becomes a system_error naming the call and its errno; non-blocking
// transfers report progress, would_block and closed; the poller's wake-up
// reaches a waiter.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "transport/bulk/tcp_socket.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;

namespace {

std::string text_of(const caf::error& e) {
  return e.context().empty() ? std::string{}
                             : e.context().get_as<std::string>(0);
}

struct socket_pair {
  unique_fd a, b;
  socket_pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

} // namespace

TEST_CASE("a failed call is a system_error naming the call and errno") {
  errno = 0;
  auto err = sys_check("close(bad fd)", ::close(-1));
  REQUIRE(err);
  CHECK(static_cast<transport_errc>(err.code())
        == transport_errc::system_error);
  auto text = text_of(err);
  CHECK(text.find("close(bad fd)") != std::string::npos);
  CHECK(text.find(std::strerror(EBADF)) != std::string::npos);
  CHECK(text.find("errno " + std::to_string(EBADF)) != std::string::npos);
  CHECK(!sys_check("getpid", ::getpid()));
  // Socket options on a bad descriptor fail the same way.
  auto opt = set_nodelay(-1);
  REQUIRE(opt);
  CHECK(text_of(opt).find("setsockopt(TCP_NODELAY)") != std::string::npos);
  auto fd = sys_fd("dup", ::dup(-1));
  REQUIRE(!fd);
  CHECK(text_of(fd.error()).find("dup") != std::string::npos);
}

TEST_CASE("non-blocking transfers report progress, would_block and closed") {
  socket_pair p;
  char buf[64];
  CHECK(recv_some(p.b.get(), buf, sizeof(buf)).status
        == io_status::would_block);
  auto s = send_some(p.a.get(), "hello", 5);
  CHECK(s.status == io_status::progress);
  CHECK(s.bytes == 5);
  auto r = recv_some(p.b.get(), buf, sizeof(buf));
  CHECK(r.status == io_status::progress);
  CHECK(r.bytes == 5);
  CHECK(std::memcmp(buf, "hello", 5) == 0);
  // Fill the socket buffer until the sender would block.
  std::string big(1 << 16, 'x');
  io_result w;
  for (int i = 0; i < 1024; ++i) {
    w = send_some(p.a.get(), big.data(), big.size());
    if (w.status != io_status::progress)
      break;
  }
  CHECK(w.status == io_status::would_block);
  p.a.reset();
  for (;;) {
    r = recv_some(p.b.get(), buf, sizeof(buf));
    if (r.status != io_status::progress)
      break;
  }
  CHECK(r.status == io_status::closed);
  // Sending to a closed peer fails with the call named.
  auto f = send_some(p.b.get(), "x", 1);
  CHECK(f.status == io_status::failed);
  CHECK(text_of(f.error).find("send") != std::string::npos);
}

TEST_CASE("a blocking full transfer that comes up short is peer_lost") {
  socket_pair p;
  REQUIRE(!send_all(p.a.get(), "abc", 3, "greeting"));
  p.a.reset();
  char buf[8];
  auto err = recv_all(p.b.get(), buf, sizeof(buf), "greeting");
  REQUIRE(err);
  // Non-blocking pair: the short read is seen as would-block or close.
  CHECK(static_cast<transport_errc>(err.code()) == transport_errc::peer_lost);
  CHECK(text_of(err).find("greeting") != std::string::npos);
}

TEST_CASE("the poller wakes a waiter and reports ready descriptors") {
  poller pl;
  REQUIRE(!pl.open());
  epoll_event ev[4];
  auto n = pl.wait(ev, 4, 0);
  REQUIRE(n);
  CHECK(*n == 0);
  REQUIRE(!pl.wake());
  n = pl.wait(ev, 4, 1000);
  REQUIRE(n);
  REQUIRE(*n == 1);
  CHECK(uint64_t{ev[0].data.u64} == poller::wake_token);
  REQUIRE(!pl.drain_wake());
  n = pl.wait(ev, 4, 0);
  CHECK(*n == 0);
  socket_pair p;
  REQUIRE(!pl.add(p.b.get(), EPOLLIN, 42));
  CHECK(pl.add(p.b.get(), EPOLLIN, 42)); // twice: EEXIST
  REQUIRE(send_some(p.a.get(), "x", 1).status == io_status::progress);
  n = pl.wait(ev, 4, 1000);
  REQUIRE(*n == 1);
  CHECK(uint64_t{ev[0].data.u64} == 42);
  REQUIRE(!pl.remove(p.b.get()));
  CHECK(pl.remove(p.b.get())); // not watched: ENOENT
}
