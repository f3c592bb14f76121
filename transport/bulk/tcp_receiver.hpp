// The receive side of the tcp backend: the listener and one receive thread
// per traffic class. The control thread accepts, runs the listener half of the
// handshake (tcp_handshake.hpp) and hands each authenticated connection to
// the thread of the class it declared. A thread reads frame headers, checks
// region, key and bounds BEFORE reading a payload byte, then recv()s the
// payload straight into the registered region (pinned while it lands); a
// rejected frame's payload is read into scratch and discarded, and answered
// with a typed negative acknowledgement. Acknowledgements go back in frame
// order. Garbage or oversized frames, failed authentication and connections
// stuck mid-handshake or mid-frame longer than the io timeout are dropped and
// counted; other connections are unaffected.
//
// Thread safety: start() and stop() from the owner; the threads share only
// the tcp_context (thread-safe) and the hand-over queue of each loop.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "transport/bulk/tcp_context.hpp"
#include "transport/bulk/tcp_socket.hpp"

namespace dualpath::transport::bulk {

class tcp_receiver {
public:
  explicit tcp_receiver(tcp_context& ctx);
  ~tcp_receiver();

  /// Binds the listener (`transport.tcp_listen`) and starts the threads.
  caf::error start();

  /// Stops the threads and closes every inbound connection.
  void stop();

  /// The port the listener is bound to (after start()).
  uint16_t port() const {
    return port_;
  }

  class loop; // one receive thread (tcp_receiver.cpp)

private:
  tcp_context& ctx_;
  unique_fd listen_;
  uint16_t port_ = 0;
  std::array<std::unique_ptr<loop>, traffic_class_count> loops_;
};

} // namespace dualpath::transport::bulk
