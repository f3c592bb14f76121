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
// counted; other connections are unaffected. The kv thread polls its sockets
// before it sleeps while a frame is half read (up to tcp_kv_spin), between
// frames for at most 100 us.
//
// Every inbound connection is attributed to the node its hello named (the
// MAC covers the name, so only a holder of the secret can claim one), which
// is what drop_peer() closes by.
//
// Thread safety: start(), stop() from the owner; drop_peer() from any thread
// (see there); the threads share the tcp_context (thread-safe), the
// hand-over queue of each loop and the drop marks (under a mutex).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

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

  /// Closes every inbound connection `peer` opened before the call and
  /// returns once no receive thread reads from any of them: after the
  /// return, no byte sent on those connections is written into a
  /// registered region, whatever the peer still sends (a frame it had begun
  /// stays partly landed: the bytes before the call are there, none after),
  /// and their unacknowledged frames are never acknowledged. A connection
  /// of `peer` still mid-handshake at the call is refused when its hello
  /// arrives. Connections `peer` opens after the call are served as usual
  /// (a reconnect works). Blocks for at most one receive pass of each
  /// thread (a few milliseconds). Called from a receive thread (an
  /// immediate handler) it waits for no thread (two handlers dropping at
  /// once would wait for each other): the calling thread stops reading the
  /// peer when the handler returns, the other closes the peer's
  /// connections at the end of its current pass.
  void drop_peer(const std::string& peer);

  /// The port the listener is bound to (after start()).
  uint16_t port() const {
    return port_;
  }

  class loop; // one receive thread (tcp_receiver.cpp)

private:
  /// True if a connection accepted as number `serial` that authenticated
  /// as `peer` was opened before a drop_peer(peer) and must be closed.
  bool dropped(const std::string& peer, uint64_t serial);

  tcp_context& ctx_;
  std::atomic<uint64_t> accepted_{0}; ///< Serial of the next accepted one.
  std::mutex marks_mtx_;
  /// peer -> the serial from which its connections are served again.
  std::unordered_map<std::string, uint64_t> marks_;
  unique_fd listen_;
  uint16_t port_ = 0;
  std::array<std::unique_ptr<loop>, traffic_class_count> loops_;
};

} // namespace dualpath::transport::bulk
