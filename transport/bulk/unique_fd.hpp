// A file descriptor closed on destruction: the one RAII descriptor of the
// bulk transport (the tcp backend's sockets and epoll/eventfd descriptors,
// the verbs backend's side channel and wake-up eventfd).
//
// Thread safety: a value type; one owner at a time.
#pragma once

#include <unistd.h>

namespace dualpath::transport::bulk {

/// Move-only owner of a descriptor; -1 holds nothing.
class unique_fd {
public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {
    // nop
  }
  unique_fd(unique_fd&& other) noexcept : fd_(other.release()) {
    // nop
  }
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other)
      reset(other.release());
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() {
    reset();
  }
  int get() const {
    return fd_;
  }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes what it holds and takes `fd`. close() is not retried on EINTR
  /// (Linux releases the descriptor anyway) and its failure leaves nothing
  /// to undo.
  void reset(int fd = -1) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const {
    return fd_ >= 0;
  }

private:
  int fd_ = -1;
};

} // namespace dualpath::transport::bulk
