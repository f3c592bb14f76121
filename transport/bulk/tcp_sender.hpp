// The send side of the tcp backend: one lane (a thread with its own
// connections, queues and epoll set) per traffic class, so a kv write never
// holds up a control write in user space, and the kv lane runs at the kv
// class's CPU priority (tcp_class_policy.hpp).
//
// enqueue() slices each write into frames of at most `transport.slice_kib`
// (never above the receiver's frame bound) and hands the batch to its class's
// lane through a short inbox (the only lock a poster takes; no system call
// runs under it). A lane connects lazily (tcp_handshake.hpp), then works in
// passes over its peers: before each write it asks the peer's shared
// weighted round robin (wrr.hpp) for a grant, so while both classes have data
// for a peer their bytes follow the weights; it writes with writev (kv: at most
// `tcp_kv_chunk_kib` per call), reads the in-order acknowledgements, completes
// a batch when every frame of it is acknowledged (so no completion precedes
// its bytes landing in the destination) and fails batches past their
// deadline. The kv lane keeps `tcp_kv_connections` connections per peer:
// each batch goes whole on the least loaded one (its immediate after its
// bytes), and they take turns per grant. With batches pending, the kv lane
// polls for up to `tcp_kv_spin_us` before it sleeps. Bounded queues: at most
// `max_pending_batches` per peer and class, more fail queue_full.
//
// Thread safety: every public member function may be called from any thread;
// completion sinks run on the batch's lane thread without any lock held.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport/bulk/tcp_context.hpp"

namespace dualpath::transport::bulk {

class tcp_sender {
public:
  explicit tcp_sender(tcp_context& ctx);

  /// Stops the lanes (see stop()).
  ~tcp_sender();

  /// Starts one lane thread per class; fails when a thread's scheduling
  /// cannot be applied.
  caf::error start();

  /// Stops the lanes; every batch still pending completes with peer_lost.
  void stop();

  /// Learns (or updates) where `peer` listens.
  void set_address(const std::string& peer, std::string host, uint16_t port);

  /// Queues a validated batch (deadline set); takes `sink` only on
  /// success. Errors: peer_lost (unknown peer), queue_full.
  caf::error enqueue(const batch& b, completion_sink& sink);

  /// Closes the connections to `peer`; its pending batches fail peer_lost.
  void drop_peer(const std::string& peer);

  /// Fails every pending batch that reads from local region `region_id`
  /// (unknown_region), closing a connection where one of them is partly
  /// written; asynchronous (the lanes let go of the region soon after).
  void cancel_source(uint32_t region_id);

  class lane;       // one per traffic class (tcp_sender.cpp)
  struct peer_link; // what both lanes share about one peer

private:
  tcp_context& ctx_;
  std::mutex links_mtx_; // guards links_ (set_address only)
  std::unordered_map<std::string, std::shared_ptr<peer_link>> links_;
  std::array<std::unique_ptr<lane>, traffic_class_count> lanes_;
};

} // namespace dualpath::transport::bulk
