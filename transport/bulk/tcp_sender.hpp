// The send side of the tcp backend. enqueue() slices each write into frames of
// at most `transport.slice_kib` (never above the receiver's frame bound) and
// queues them on the connection of the batch's traffic class to its peer.
// The sender thread connects lazily (tcp_handshake.hpp), then works in
// passes: per peer it arbitrates between the classes by weighted round robin
// over byte grants (wrr.hpp; a lone class sends larger grants uncharged),
// writes with writev, reads the in-order acknowledgements and completes a
// batch when every frame of it is acknowledged, and fails batches past their
// deadline. A pass is bounded in bytes, so a control batch posted meanwhile
// waits at most about one pass.
//
// Thread safety: every public member function may be called from any thread;
// completion sinks run on the sender thread without any lock held.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "transport/bulk/tcp_context.hpp"
#include "transport/bulk/tcp_socket.hpp"

namespace dualpath::transport::bulk {

class tcp_sender {
public:
  explicit tcp_sender(tcp_context& ctx);

  /// Fails every pending batch with peer_lost after stopping the thread.
  ~tcp_sender();

  caf::error start();

  /// Stops the thread; every batch still pending completes with peer_lost.
  void stop();

  /// Learns (or updates) where `peer` listens.
  void set_address(const std::string& peer, std::string host, uint16_t port);

  /// Queues a validated batch (deadline set); takes `sink` only on
  /// success. Errors: peer_lost (unknown peer), queue_full (more than
  /// `max_pending_batches` pending to that peer).
  caf::error enqueue(const batch& b, completion_sink& sink);

  /// Closes the connections to `peer`; its pending batches fail peer_lost.
  void drop_peer(const std::string& peer);

  struct peer_state; // per peer: connections, queues, arbiter
  struct out_conn;   // per (peer, class)
  struct batch_state;

private:
  void wake();
  void finish(batch_state& b, caf::error err);
  void fail_conn(out_conn& c, transport_errc code, const std::string& why);
  void fail_conn(out_conn& c, caf::error err);
  void connect_needed(std::unique_lock<std::mutex>& guard);
  void read_acks(peer_state& p, out_conn& c);
  size_t write_some(peer_state& p, out_conn& c, size_t quantum);
  bool pump(peer_state& p);
  void check_deadlines();
  void deliver();
  void run();

  tcp_context& ctx_;
  std::mutex mtx_; // guards peers_, batches_, done_
  std::vector<std::unique_ptr<peer_state>> peers_;
  std::unordered_map<std::string, size_t> peer_index_;
  std::list<std::shared_ptr<batch_state>> batches_;
  std::vector<std::pair<completion_sink, completion>> done_;

  poller poll_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

} // namespace dualpath::transport::bulk
