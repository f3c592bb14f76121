#include "transport/bulk/tcp_socket.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace dualpath::transport::bulk {

caf::error sys_error(const char* call, int err) {
  return caf::make_error(transport_errc::system_error,
                         std::string{call} + ": " + std::strerror(err)
                             + " (errno " + std::to_string(err) + ")");
}

caf::expected<unique_fd> sys_fd(const char* call, int fd) {
  if (fd < 0)
    return sys_error(call);
  return unique_fd{fd};
}

caf::expected<unique_fd> tcp_socket() {
  return sys_fd("socket", ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
}

caf::error set_nonblocking(int fd) {
  auto flags = ::fcntl(fd, F_GETFL);
  if (auto err = sys_check("fcntl(F_GETFL)", flags))
    return err;
  return sys_check("fcntl(F_SETFL, O_NONBLOCK)",
                   ::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
}

caf::error set_nodelay(int fd) {
  int one = 1;
  return sys_check(
      "setsockopt(TCP_NODELAY)",
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
}

caf::error set_reuseaddr(int fd) {
  int one = 1;
  return sys_check(
      "setsockopt(SO_REUSEADDR)",
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
}

caf::error set_io_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  auto ms = timeout.count();
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  if (auto err =
          sys_check("setsockopt(SO_RCVTIMEO)",
                    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv))))
    return err;
  return sys_check("setsockopt(SO_SNDTIMEO)",
                   ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)));
}

namespace {

/// Classifies one transfer's return value (errno read right after it).
io_result classify(const char* call, ssize_t n, bool is_recv) {
  io_result r;
  if (n > 0) {
    r.bytes = static_cast<size_t>(n);
    return r;
  }
  if (n == 0) {
    // recv: orderly shutdown; send of a non-empty buffer never returns 0.
    r.status = is_recv ? io_status::closed : io_status::would_block;
    return r;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    r.status = io_status::would_block;
    return r;
  }
  r.status = io_status::failed;
  r.error = sys_error(call);
  return r;
}

template <class Call>
ssize_t retry_eintr(Call call) {
  for (;;) {
    auto n = call();
    if (n >= 0 || errno != EINTR)
      return n;
  }
}

} // namespace

io_result send_some(int fd, const void* buf, size_t len) {
  auto n = retry_eintr(
      [&] { return ::send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT); });
  return classify("send", n, false);
}

io_result sendmsg_some(int fd, const iovec* iov, size_t count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = count;
  auto n = retry_eintr(
      [&] { return ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT); });
  return classify("sendmsg", n, false);
}

io_result recv_some(int fd, void* buf, size_t len) {
  auto n = retry_eintr([&] { return ::recv(fd, buf, len, MSG_DONTWAIT); });
  return classify("recv", n, true);
}

caf::error send_all(int fd, const void* buf, size_t len, const char* what) {
  auto p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    auto n = retry_eintr([&] { return ::send(fd, p, len, MSG_NOSIGNAL); });
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return sys_error("send");
    if (n <= 0)
      return caf::make_error(transport_errc::peer_lost,
                             std::string{what} + " not sent");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return caf::none;
}

caf::error recv_all(int fd, void* buf, size_t len, const char* what) {
  auto p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    auto n = retry_eintr([&] { return ::recv(fd, p, len, 0); });
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return sys_error("recv");
    if (n <= 0)
      return caf::make_error(transport_errc::peer_lost,
                             std::string{"no "} + what + " received");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return caf::none;
}

caf::error poller::open() {
  auto ep = sys_fd("epoll_create1", ::epoll_create1(EPOLL_CLOEXEC));
  if (!ep)
    return std::move(ep.error());
  auto wake = sys_fd("eventfd", ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake)
    return std::move(wake.error());
  ep_ = std::move(*ep);
  wake_ = std::move(*wake);
  return add(wake_.get(), EPOLLIN, wake_token);
}

caf::error poller::add(int fd, uint32_t events, uint64_t token) {
  return control("epoll_ctl(ADD)", EPOLL_CTL_ADD, fd, events, token);
}

caf::error poller::modify(int fd, uint32_t events, uint64_t token) {
  return control("epoll_ctl(MOD)", EPOLL_CTL_MOD, fd, events, token);
}

caf::error poller::control(const char* call, int op, int fd, uint32_t events,
                           uint64_t token) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  return sys_check(call, ::epoll_ctl(ep_.get(), op, fd, &ev));
}

caf::error poller::remove(int fd) {
  return sys_check("epoll_ctl(DEL)",
                   ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr));
}

caf::expected<int> poller::wait(epoll_event* events, int max, int timeout_ms) {
  auto n = ::epoll_wait(ep_.get(), events, max, timeout_ms);
  if (n < 0 && errno == EINTR)
    return 0;
  if (auto err = sys_check("epoll_wait", n))
    return err;
  return n;
}

caf::error poller::wake() {
  uint64_t one = 1;
  auto n = ::write(wake_.get(), &one, sizeof(one));
  // EAGAIN: the counter is saturated, so a wake-up is pending anyway.
  if (n < 0 && errno == EAGAIN)
    return caf::none;
  return sys_check("write(eventfd)", n);
}

caf::error poller::drain_wake() {
  uint64_t x;
  auto n = ::read(wake_.get(), &x, sizeof(x));
  // EAGAIN: another drain consumed it already.
  if (n < 0 && errno == EAGAIN)
    return caf::none;
  return sys_check("read(eventfd)", n);
}

} // namespace dualpath::transport::bulk
