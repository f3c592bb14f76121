// The system calls of the tcp backend, each result checked in one place: a
// failed call becomes a `transport_errc::system_error` whose context names the
// call and its errno, so no caller can ignore or lose one. Also the RAII file
// descriptor, the non-blocking send/recv outcome type and an epoll set with its
// wake-up eventfd.
//
// Thread safety: free functions are thread-safe; `unique_fd` and `poller` are
// values owned by one thread (`poller::wake` may be called from any thread).
#pragma once

#include <sys/epoll.h>
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "transport/bulk/unique_fd.hpp"
#include "transport/errors.hpp"

namespace dualpath::transport::bulk {

/// A system_error naming `call` and the errno `err`.
caf::error sys_error(const char* call, int err = errno);

/// The one check of a call's return value: none when `rc >= 0`, otherwise
/// sys_error(call, errno). Read errno right after the call.
template <class Int>
caf::error sys_check(const char* call, Int rc) {
  if (rc < 0)
    return sys_error(call);
  return caf::none;
}

/// Wraps the result of a call that returns a new descriptor.
caf::expected<unique_fd> sys_fd(const char* call, int fd);

/// A new TCP/IPv4 socket (close-on-exec).
caf::expected<unique_fd> tcp_socket();

caf::error set_nonblocking(int fd);
caf::error set_nodelay(int fd);
caf::error set_reuseaddr(int fd);

/// Bounds blocking send/recv on `fd` by `timeout` (0 clears the bound).
caf::error set_io_timeout(int fd, std::chrono::milliseconds timeout);

/// What one non-blocking transfer did. EINTR is retried inside.
enum class io_status : uint8_t {
  /// `bytes` > 0 were transferred.
  progress,
  /// The socket's buffer is full (send) or empty (recv).
  would_block,
  /// The peer closed the connection (recv returned 0).
  closed,
  /// The call failed; `error` names it and its errno.
  failed,
};

struct io_result {
  io_status status = io_status::progress;
  size_t bytes = 0;
  caf::error error;
};

io_result send_some(int fd, const void* buf, size_t len);
io_result sendmsg_some(int fd, const iovec* iov, size_t count);
io_result recv_some(int fd, void* buf, size_t len);

/// Blocking full transfers, bounded by the socket's SO_*TIMEO (handshake):
/// a short transfer (peer closed, timeout) fails with peer_lost naming
/// `what`; any other failure is the call's system_error.
caf::error send_all(int fd, const void* buf, size_t len, const char* what);
caf::error recv_all(int fd, void* buf, size_t len, const char* what);

/// An epoll set plus an eventfd that wakes its waiter. Event data are
/// caller-chosen 64-bit tokens; `wake_token` is reserved for the eventfd.
class poller {
public:
  static constexpr uint64_t wake_token = ~uint64_t{0};

  /// Creates the epoll set and the eventfd.
  caf::error open();

  caf::error add(int fd, uint32_t events, uint64_t token);
  caf::error modify(int fd, uint32_t events, uint64_t token);
  caf::error remove(int fd);

  /// Waits up to `timeout_ms` (0: poll); returns the number of events
  /// (0 on timeout or EINTR).
  caf::expected<int> wait(epoll_event* events, int max, int timeout_ms);

  /// Polls without sleeping (epoll_wait with a zero timeout) until an
  /// event, `stop()` holds, or `spin` has passed; returns the events (0:
  /// none came). `spins` counts the polls that found nothing.
  template <class Stop>
  caf::expected<int> spin(epoll_event* events, int max,
                          std::chrono::nanoseconds spin, Stop stop,
                          uint64_t& spins) {
    auto until = std::chrono::steady_clock::now() + spin;
    for (;;) {
      auto n = wait(events, max, 0);
      if (!n || *n > 0 || stop() || std::chrono::steady_clock::now() >= until)
        return n;
      ++spins;
    }
  }

  /// Makes the next (or current) wait return (any thread).
  caf::error wake();

  /// Consumes pending wake-ups (after a wake_token event).
  caf::error drain_wake();

private:
  /// epoll_ctl(op) of `fd` for `events`, the error named `call`.
  caf::error control(const char* call, int op, int fd, uint32_t events,
                     uint64_t token);

  unique_fd ep_;
  unique_fd wake_;
};

} // namespace dualpath::transport::bulk
