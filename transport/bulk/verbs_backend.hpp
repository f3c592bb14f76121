// The verbs backend (rdma-core): one-sided RDMA WRITEs over RC queue pairs,
// one connection per (sender, receiver) pair with one queue pair per lane:
// lane 0 for control traffic, lanes 1..K (K = verbs_kv_queue_pairs) for KV.
//
// Connections. details_for() is the same for every peer: the address of this
// backend's side-channel listener and its incarnation (a random number per
// process). A sender's connect(peer, details), or its first post after a
// connection broke, runs the handshake of verbs_wire.hpp over a new TCP side
// channel: both ends prove the shared secret, exchange queue pair endpoints
// (one RC queue pair per lane on each side; the sender's send, the
// receiver's take WRITE_WITH_IMM notices) and the receiver hands over its
// region table. The side channel stays open: the sender asks it for a fresh
// table when a write names a region it does not know, the receiver announces
// removed regions on it, and its end (the receiver process died) fails every
// pending batch of that connection at once with peer_lost. A connection that
// breaks for any reason is torn down on both sides and made anew on the next
// post (after a failed attempt, posts fail at once for one second); a peer
// that restarted (new incarnation) must be connected again with its new
// details.
//
// Writes. A batch is checked against the receiver's table before anything is
// posted: an unknown region, a wrong key or a range outside the region fails
// locally (unknown_region, wrong_key, out_of_bounds) and the connection stays
// usable. It is then one linked chain of RDMA WRITEs (WRITE_WITH_IMM last when
// it carries an immediate) posted with one ibv_post_send, only its last work
// request signalled; at most transport.max_outstanding work requests are
// outstanding per queue pair and later batches wait in a FIFO per class (at
// most max_pending_batches per peer, then queue_full). A control batch goes
// on lane 0; a KV batch on the KV lane with the fewest outstanding work
// requests that has room, so KV batches may complete out of order (each
// batch, and its immediate, stays on one queue pair). A batch of more work
// requests than that is posted as consecutive parts that fit (in order on
// the first lane of its class, the immediate with the last part) and completes
// once, after its last part, with the first part's error if any failed. Every
// batch has its own deadline: a batch not yet posted fails then; a posted one
// completes with deadline_exceeded then, its source stays in use until the
// device is done with it, and if it is still outstanding io_timeout later its
// connection (only that one) is moved to ERR.
//
// Completions, receives, deadlines and asynchronous device events (port down,
// fatal queue pair errors -> peer lost for every pending batch) are handled
// on a poller thread; handshakes and side-channel traffic on a side-channel
// thread and a connector thread. KV lane k of every connection has a CQ of
// its own for the send completions and a thread (dp-verbs-kv<k>) that polls
// it and runs those callbacks. KV chains are posted outside the lock, one
// poster per lane at a time, in order: the lane's thread while it is awake;
// while it sleeps, the thread that queued a chain posts it, and whatever
// else is queued meanwhile, right after it leaves the lock (flat
// combining), so a lone batch is not handed over. A lane's thread refills
// its own lane first. So K lanes post and complete on K cores at once (on a
// software RDMA device such as rxe, ibv_post_send runs the protocol on the
// posting thread). Control-lane batches are
// posted under the lock, as before. The main CQ serves the control lane and
// every receive; each CQ grows with the connections (every queue pair's
// depth), bounded by the device's largest.
//
// Every ibv_* and system call goes through verbs_call.hpp's helpers.
//
// Thread safety: as backend (every member may be called concurrently), with
// one addition: deregistration (a local_registration's destructor) waits
// until no posted work request reads the region, so it must not run inside a
// completion sink.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/verbs_device.hpp"
#include "transport/bulk/verbs_qp.hpp"
#include "transport/bulk/verbs_wire.hpp"

namespace dualpath::transport::bulk {

class verbs_backend final : public backend {
public:
  /// Opens the device and starts the threads (errors: see device::open).
  static caf::expected<std::unique_ptr<verbs_backend>>
  open(const options& opts);

  ~verbs_backend() override;

  capabilities caps() const override;
  const std::string& node() const override {
    return opts_.node;
  }
  caf::expected<local_registration> register_region(void* ptr, uint64_t len,
                                                    memory_kind kind,
                                                    int dmabuf_fd) override;
  caf::expected<std::vector<uint8_t>>
  details_for(const std::string& peer) override;
  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override;
  void post(batch b, completion_sink sink) override;
  void on_immediate(immediate_handler f) override;
  counters stats() const override;
  void drop_peer(const std::string& peer) override;

  /// Registers [ptr, ptr+len) under a region id and key the caller chose
  /// (unique per node): the auto backend gives its tcp half's, so one
  /// descriptor is valid on both paths.
  caf::expected<local_registration> register_as(void* ptr, uint64_t len,
                                                memory_kind kind, int dmabuf_fd,
                                                uint32_t region_id,
                                                uint64_t key);

  /// Bytes posted on each KV lane so far (index k-1 for lane k), over every
  /// connection: how KV traffic spread over the lanes.
  std::vector<uint64_t> kv_lane_bytes() const;

  /// The device, port and GID in use (for logs).
  const std::string& description() const {
    return dev_.description();
  }

protected:
  void deregister(uint32_t region_id) override;

private:
  using done_list = std::vector<std::pair<completion_sink, completion>>;

  /// Receive work requests per receiving queue pair (WRITE_WITH_IMM
  /// notices); reposted as they complete.
  static constexpr uint32_t recv_depth = 64;

  /// After a failed handshake, posts to that peer fail at once this long.
  static constexpr std::chrono::seconds retry_pause{1};

  /// KV batches signal one completion per this many batches at most (each
  /// signalled one retires those before it); control batches signal each.
  static constexpr uint32_t signal_every = 16;

  /// The poller spins while batches are outstanding and the last
  /// completion came less than this long ago (then sleeps on events).
  static constexpr std::chrono::milliseconds spin_window{5};

  /// A sender's connection towards one peer.
  enum class link_state : uint8_t {
    idle,       ///< Address known, no connection (none yet or torn down).
    connecting, ///< A handshake is in flight on the connector thread.
    connected,  ///< Queue pairs in RTS, side channel open.
    failed,     ///< The last attempt failed; posts fail until retry_at.
  };

  enum class batch_state : uint8_t {
    parked,  ///< Waiting for the connection or the peer's region table.
    queued,  ///< Checked, waiting for room on its queue pair.
    posted,  ///< On the queue pair.
    expired, ///< Posted, completed with deadline_exceeded, still on the QP.
  };

  struct pending {
    uint64_t id = 0;
    batch b;
    completion_sink sink;
    std::string peer;
    uint32_t wrs = 0;
    uint64_t bytes = 0;
    batch_state state = batch_state::parked;
    bool pinned = false;     ///< A part of a split batch: first lane only.
    uint8_t lane = 0;        ///< The lane it was posted on.
    uint64_t conn = 0;       ///< Connection it was posted on.
    uint64_t need_fetch = 0; ///< First table fetch that is authoritative.
    std::vector<uint32_t> sources;
    std::vector<std::pair<uint64_t, uint32_t>> targets; ///< addr, rkey
  };

  struct outgoing {
    std::string peer;
    verbs::host_port address;
    uint64_t incarnation = 0; ///< Expected from the details (0: any).
    link_state state = link_state::idle;
    uint64_t conn = 0;    ///< Id of the current connection.
    uint64_t attempt = 0; ///< The handshake attempt in flight or last.
    caf::error last_error;
    clock_type::time_point retry_at{};
    /// One queue pair per lane (lanes of them); shared with a KV lane's
    /// thread while it posts outside the lock.
    size_t lanes = 0;
    std::shared_ptr<verbs::queue_pair> qps[verbs::max_lanes];
    std::unordered_map<uint32_t, verbs::region_entry> table;
    uint64_t fetches = 0;     ///< Table fetches started.
    uint64_t table_fetch = 0; ///< The fetch the table in hand came from.
    bool fetch_in_flight = false;
    std::deque<uint64_t> queued[traffic_class_count];
    size_t next_kv = 1; ///< The KV lane whose turn it is among equals.
    // Per lane:
    uint32_t outstanding[verbs::max_lanes] = {};
    /// Batch ids on each queue pair in posting order (0: a fence).
    std::deque<uint64_t> wire[verbs::max_lanes];
    uint32_t signaled[verbs::max_lanes] = {}; ///< on the wire
    uint32_t quiet[verbs::max_lanes] = {};    ///< batches since one
    uint32_t quiet_wrs[verbs::max_lanes] = {};
    std::pair<uint64_t, uint32_t> last_target[verbs::max_lanes] = {};
    std::vector<uint64_t> parked;
    size_t batches = 0;
  };

  /// A receiver's end of a peer's connection.
  struct incoming {
    std::string peer;
    size_t lanes = 0;
    verbs::queue_pair qps[verbs::max_lanes];
  };

  /// A chain of work requests for one queue pair, posted by its lane's
  /// thread outside the lock (the queue pair is kept alive meanwhile).
  struct staged {
    std::shared_ptr<verbs::queue_pair> qp;
    uint64_t conn = 0;
    std::vector<ibv_sge> sges;
    std::vector<ibv_send_wr> wrs; ///< linked; sg_list into sges
  };

  /// A KV lane's thread, its CQ (send completions of lane k of every
  /// outgoing connection) and the chains waiting to be posted on it. The
  /// chains (holding queue pairs on this CQ) are declared after it, so they
  /// go first.
  struct kv_lane {
    const verbs_backend* owner = nullptr;
    size_t index = 0; ///< the lane number (1..K)
    verbs::channel_ptr channel;
    verbs::cq_ptr cq;
    verbs::unique_fd wake_fd; ///< wakes the thread to stop
    int cq_capacity = 0;      ///< under mtx_
    int cq_used = 0;          ///< under mtx_
    std::mutex cq_mtx;        ///< serialises ibv_poll_cq with ibv_resize_cq
    std::mutex mtx;           ///< guards chains and posting; after mtx_
    std::deque<staged> chains;
    /// A thread is posting this lane's chains (it takes every chain queued
    /// until none is left, then clears this).
    bool posting = false;
    /// The lane's thread is not asleep: it posts what is queued (else the
    /// thread that queues it does).
    bool awake = true;
    /// Batches on this lane's queue pairs (posted or expired): the lane's
    /// thread spins only while some are, so sparse KV traffic (a batch at
    /// a time) does not keep a core busy per lane.
    std::atomic<uint64_t> inflight{0};
    std::thread thread;
  };

  struct local_mr {
    verbs::mr_ptr mr;
    uint64_t key = 0;
    uint64_t base = 0;
    uint64_t length = 0;
    uint32_t uses = 0; ///< Batches reading it (queued or on a QP).
    bool removing = false;
  };

  /// Work for the side-channel thread (which owns every channel).
  struct side_command {
    enum kind_t : uint8_t { adopt, close, send } kind = send;
    uint64_t conn = 0;
    bool sender = false; ///< adopt: this end is the sending side.
    verbs::channel ch;   ///< adopt
    verbs::frame_type type = verbs::frame_type::regions_req;
    std::vector<uint8_t> body;
  };

  /// A handshake being served: challenge sent, hello awaited.
  struct half_open {
    verbs::channel ch;
    uint8_t nonce[32] = {};
    clock_type::time_point until{};
  };

  /// Bound of each handshake step: io_timeout, but at least 10 s, since a
  /// step includes queue pair transitions that resolve the peer's address
  /// (ARP on RoCE), slow on a loaded host. Posts do not wait for it.
  std::chrono::milliseconds handshake_timeout() const {
    return std::max<std::chrono::milliseconds>(opts_.io_timeout,
                                               std::chrono::seconds{10});
  }

  /// Handshakes served at once; more connections are closed at once.
  static constexpr size_t max_half_open = 64;

  struct client_result {
    verbs::channel ch;
    size_t lanes = 0;
    std::shared_ptr<verbs::queue_pair> qps[verbs::max_lanes];
    std::vector<verbs::region_entry> table;
  };

  verbs_backend(const options& opts, verbs::device dev);
  caf::error start();

  // verbs_backend.cpp: registrations, posting, connections' bookkeeping.
  caf::expected<local_registration> add_region(void* ptr, uint64_t len,
                                               memory_kind kind, int dmabuf_fd,
                                               uint32_t id, uint64_t key);
  /// Fails a batch that was never queued (counted as posted and failed),
  /// outside mtx_.
  void fail_unposted(const batch& b, completion_sink& sink, caf::error err);
  /// post() after validation: a batch of `wrs` work requests (at most
  /// max_outstanding) joins its peer's queue.
  void enqueue(batch b, completion_sink sink, uint32_t wrs, uint64_t bytes,
               bool pinned);
  void admit(outgoing& o, pending& pb, done_list& done);
  void pump(outgoing& o, size_t tclass, done_list& done);
  /// The lane for `pb` that has room for it now, or none (max_lanes).
  size_t pick_lane(const outgoing& o, size_t tclass, const pending& pb) const;
  /// Posts a chain on `lane`: lane 0 at once (a failure breaks the
  /// connection); a KV lane's is queued for its thread, or, while that
  /// sleeps and no other thread is posting the lane, this thread becomes
  /// its poster: its next deliver() posts the lane's chains outside the
  /// lock.
  void submit(outgoing& o, size_t lane, staged s, done_list& done);
  /// Posts every chain queued on the lanes this thread became poster of.
  void post_lanes();
  /// Posts `lane`'s chains until none is left, then gives up being its
  /// poster (the caller is).
  void post_lane(kv_lane& lane);
  /// Marks the calling thread as `lane`'s (nullptr: none).
  static void set_own_lane(const kv_lane* lane);
  /// A signalled completion (of batch `upto`, or a fence when 0) retires
  /// every batch posted before it on that queue pair.
  void retire(outgoing& o, size_t lane, uint64_t upto, done_list& done);
  void post_fence(outgoing& o, size_t lane, done_list& done);
  void fail(pending& pb, transport_errc code, std::string why, done_list& done);
  void fail(pending& pb, caf::error err, done_list& done);
  void release(uint64_t id);
  void break_outgoing(outgoing& o, transport_errc code, const std::string& why,
                      done_list& done);
  void drop_incoming(uint64_t conn);
  void start_attempt(outgoing& o);
  void request_table(outgoing& o);
  /// After leaving mtx_ (every path that queued work ends here): posts the
  /// lanes this thread became poster of, then runs the completions.
  void deliver(done_list& done);
  std::vector<verbs::region_entry> table_snapshot() const;
  caf::error grow_cq(int entries);
  /// The CQ entries one outgoing connection takes (main CQ: control lane
  /// and receive queues; each KV lane's CQ: its queue pair's sends).
  caf::error reserve_outgoing();
  void unreserve_outgoing();
  outgoing* find_conn(uint64_t conn);

  // verbs_handshake.cpp: the connector and side-channel threads.
  void connector_loop();
  caf::expected<client_result> client_handshake(const std::string& peer,
                                                verbs::host_port address,
                                                uint64_t incarnation);
  void finish_attempt(const std::string& peer, uint64_t attempt,
                      caf::expected<client_result> res, done_list& done);
  void side_loop();
  /// Sends an accepted connection the challenge.
  caf::expected<half_open> greet(verbs::channel ch);
  /// Serves the rest with the hello `f` that arrived; returns the new
  /// receiving connection's id and its side channel (id 0 when it failed).
  std::pair<uint64_t, verbs::channel>
  serve_handshake(half_open h, caf::expected<verbs::frame> f);
  void on_side_frame(uint64_t conn, verbs::frame f);
  void on_side_lost(uint64_t conn, bool sender, const caf::error& why);
  /// Queues `c` for the side thread (commands_mtx_); the caller wakes it.
  void command_side(side_command c);
  void wake();
  void wake_poller();

  // verbs_completion.cpp: the poller thread and the KV lanes' threads.
  void poll_loop();
  void lane_loop(kv_lane& lane);
  /// Polls `cq` (under `cq_mtx`) until it is empty, handling each
  /// completion under mtx_; a failed poll breaks every connection. `lane`
  /// names the CQ in errors (0: the main CQ). Returns the completions seen.
  int drain(ibv_cq* cq, std::mutex& cq_mtx, size_t lane, done_list& done,
            std::vector<incoming_immediate>& imms);
  void on_completion(const ibv_wc& wc, done_list& done,
                     std::vector<incoming_immediate>& imms);
  void check_deadlines(done_list& done);
  void on_async_event(const ibv_async_event& ev, done_list& done);
  caf::error post_recv(ibv_qp* qp, uint64_t conn);

  options opts_;
  uint64_t incarnation_ = 0;
  // Declared in acquisition order: destroyed in reverse.
  verbs::device dev_;
  verbs::channel_ptr channel_;
  verbs::cq_ptr cq_;
  /// KV lanes 1..K (index k-1); their threads start and stop with the
  /// poller's. Declared after cq_ and before the connections, whose queue
  /// pairs use their CQs.
  std::vector<std::unique_ptr<kv_lane>> kv_lanes_;
  verbs::listener listener_;
  verbs::unique_fd wake_fd_;      ///< eventfd waking the side-channel thread
  verbs::unique_fd poll_wake_fd_; ///< eventfd waking the poller thread
  std::string address_;           ///< host:port of listener_
  mutable std::mutex mtx_;        // guards everything below
  /// connect() waiting for its attempt, deregister() for a region's last
  /// use: notified when those change, not on every completion.
  std::condition_variable cv_;
  /// The connector thread waiting for connect_jobs_ (or stop_).
  std::condition_variable jobs_cv_;
  int cq_capacity_ = 0;
  int cq_used_ = 0;
  std::unordered_map<uint32_t, local_mr> mrs_;
  std::map<std::string, outgoing> out_;
  std::map<uint64_t, incoming> in_;
  std::unordered_map<uint64_t, pending> batches_;
  std::deque<std::pair<std::string, uint64_t>> connect_jobs_;
  uint32_t next_region_ = 1;
  uint64_t next_batch_ = 1;
  uint64_t next_conn_ = 1;
  uint64_t next_attempt_ = 1;
  counters stats_;
  uint64_t lane_bytes_[verbs::max_lanes] = {};
  /// When check_deadlines() has something to do next (clock ticks): the
  /// poller sleeps until then at most (and a post with an earlier deadline
  /// lowers it and wakes the poller), so an idle backend does not tick.
  std::atomic<int64_t> next_deadline_scan_{0};
  /// Control batches on a queue pair (posted or expired): the poller spins
  /// then (a KV lane's thread spins on its lane's own count).
  std::atomic<uint64_t> inflight_{0};
  std::mutex cq_mtx_; // serialises ibv_poll_cq with ibv_resize_cq
  /// The side thread's work, under a lock of its own: that thread takes
  /// only this one to collect it, never mtx_, which the poller holds for
  /// most of a busy stream (a side thread waiting on mtx_ every poll round
  /// was woken and refused at nearly every completion). Pushed with mtx_
  /// held or not; mtx_ is never taken while holding this.
  std::mutex commands_mtx_;
  std::vector<side_command> commands_;
  std::atomic<bool> stop_{false};
  std::mutex handler_mtx_;
  immediate_handler handler_;
  std::thread poller_;
  std::thread side_;
  std::thread connector_;
};

} // namespace dualpath::transport::bulk
