#include "transport/bulk/tcp_sender.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <list>
#include <thread>
#include <vector>

#include "transport/bulk/tcp_class_policy.hpp"
#include "transport/bulk/tcp_handshake.hpp"
#include "transport/bulk/tcp_socket.hpp"
#include "transport/bulk/tcp_wire.hpp"
#include "transport/bulk/wrr.hpp"

namespace dualpath::transport::bulk {

struct tcp_sender::peer_link {
  peer_link(std::string n, uint32_t wc, uint32_t wk)
      : name(std::move(n)), arbiter(wc, wk) {
    // nop
  }
  const std::string name;
  shared_wrr arbiter;
  /// Batches posted and not yet completed, per class (queue_full bound).
  std::array<std::atomic<uint32_t>, traffic_class_count> pending{};
};

namespace {

using link_ptr = std::shared_ptr<tcp_sender::peer_link>;

struct batch_state {
  uint64_t tag = 0;
  completion_sink sink;
  clock_type::time_point deadline;
  uint32_t ops = 0;
  uint32_t slices_left = 0;
  uint64_t acked_bytes = 0;
  link_ptr link;
  bool done = false;
  /// The source regions, held until the batch is done (finish): no one
  /// frees them while a slice may still be written from them.
  std::vector<region_table::pin> sources;
};

using batch_ptr = std::shared_ptr<batch_state>;

/// One frame: a header and the source bytes of its payload.
struct slice {
  batch_ptr b;
  wire::frame_header hdr;
  const uint8_t* src = nullptr;
  size_t sent = 0; ///< Header + payload bytes already written.
};

/// A request from a poster to a lane, applied in order on the lane thread.
struct command {
  enum class kind : uint8_t { address, post, drop, cancel };
  kind what = kind::post;
  link_ptr link;
  uint32_t region = 0; ///< cancel: the source region
  std::string host;
  uint16_t port = 0;
  batch_ptr b;
  std::vector<slice> slices;
};

constexpr size_t quantum = 64 * 1024;       // contended grant
constexpr size_t pass_budget = 1024 * 1024; // per peer per pass

} // namespace

/// One sender thread and everything it owns (see header).
class tcp_sender::lane {
public:
  lane(tcp_context& ctx, traffic_class tc)
      : ctx_(ctx),
        tc_(tc),
        spin_(tc == traffic_class::kv ? ctx.opts.tcp_kv_spin
                                      : std::chrono::microseconds{0}),
        conns_per_peer_(tc == traffic_class::kv
                            ? std::max<size_t>(ctx.opts.tcp_kv_connections, 1)
                            : 1) {
    // nop
  }

  void set_other(lane* other) {
    other_ = other;
  }

  /// Makes the epoll set; both lanes' exist before either thread runs (a
  /// lane wakes the other).
  caf::error open() {
    return poll_.open();
  }

  caf::error start() {
    return start_class_thread(thread_, ctx_.opts, tc_,
                              tc_ == traffic_class::control ? "dp-tcp-tx-ctl"
                                                            : "dp-tcp-tx-kv",
                              [this] { run(); });
  }

  /// Tells the thread to end its loop (any thread).
  void request_stop() {
    stop_ = true;
    static_cast<void>(poll_.wake()); // else the bounded poll ends it
  }

  /// Joins the thread (after both lanes were told to stop), then fails
  /// whatever is left; from then on enqueue() refuses.
  void join() {
    if (thread_.joinable())
      thread_.join();
    {
      // From now on enqueue() refuses: nothing would complete what it took.
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      stopped_ = true;
    }
    take_inbox();
    for (auto& p : peers_)
      fail_peer(
          *p, caf::make_error(transport_errc::peer_lost, "backend shut down"));
    // Batches still in the inbox of a lane that never ran.
    for (auto& b : batches_)
      finish(*b,
             caf::make_error(transport_errc::peer_lost, "backend shut down"));
    batches_.clear();
    deliver();
  }

  void set_address(link_ptr link, std::string host, uint16_t port) {
    command cmd;
    cmd.what = command::kind::address;
    cmd.host = std::move(host);
    cmd.port = port;
    {
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      registry_[link->name] = link;
      cmd.link = std::move(link);
      inbox_.push_back(std::move(cmd));
    }
    poke();
  }

  caf::error enqueue(const batch& b, completion_sink& sink) {
    const auto& opts = ctx_.opts;
    // Slice outside the inbox lock (frames never exceed the receiver's
    // bound); sequence numbers are assigned on the lane thread.
    const auto slice_len = std::max<uint64_t>(
        std::min(opts.slice_kib << 10, opts.max_frame_mib << 20), 1);
    auto held = hold_sources(ctx_.regions, b);
    if (!held)
      return std::move(held.error());
    command cmd;
    cmd.b = std::make_shared<batch_state>();
    auto& st = *cmd.b;
    st.sources = std::move(*held);
    st.tag = b.tag;
    st.deadline = b.deadline;
    st.ops = static_cast<uint32_t>(b.writes.size());
    for (size_t wi = 0; wi < b.writes.size(); ++wi) {
      const auto& w = b.writes[wi];
      auto src =
          static_cast<const uint8_t*>(w.source->data()) + w.source_offset;
      uint64_t off = 0;
      do {
        auto n = std::min(slice_len, w.destination.length - off);
        slice s;
        s.b = cmd.b;
        s.src = src + off;
        s.hdr = wire::make_header(w.destination.region_id, w.destination.key,
                                  w.destination.offset + off, n, tc_);
        bool last =
            wi + 1 == b.writes.size() && off + n == w.destination.length;
        if (last && b.immediate)
          wire::set_immediate(s.hdr, *b.immediate);
        cmd.slices.push_back(std::move(s));
        off += n;
      } while (off < w.destination.length);
    }
    st.slices_left = static_cast<uint32_t>(cmd.slices.size());
    const auto& node = b.writes.front().destination.node;
    {
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      if (stopped_)
        return caf::make_error(transport_errc::peer_lost, "backend shut down");
      auto i = registry_.find(node);
      if (i == registry_.end())
        return caf::make_error(transport_errc::peer_lost,
                               "unknown peer " + node);
      auto& pending = i->second->pending[static_cast<size_t>(tc_)];
      if (pending.fetch_add(1) >= opts.max_pending_batches) {
        pending.fetch_sub(1);
        return caf::make_error(transport_errc::queue_full,
                               "too many pending " + to_string(tc_)
                                   + " batches to " + node);
      }
      st.link = i->second;
      st.sink = std::move(sink);
      cmd.link = i->second;
      inbox_.push_back(std::move(cmd));
    }
    ctx_.stats.batches_posted += 1;
    poke();
    return caf::none;
  }

  void drop_peer(const std::string& peer) {
    {
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      auto i = registry_.find(peer);
      if (i == registry_.end())
        return;
      command cmd;
      cmd.what = command::kind::drop;
      cmd.link = i->second;
      inbox_.push_back(std::move(cmd));
    }
    poke();
  }

  void cancel_source(uint32_t region_id) {
    {
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      command cmd;
      cmd.what = command::kind::cancel;
      cmd.region = region_id;
      inbox_.push_back(std::move(cmd));
    }
    poke();
  }

  /// Makes the lane look at its inbox and arbiters soon (any thread); the
  /// eventfd is written only when the lane sleeps or is about to.
  void poke() {
    poked_.store(true);
    if (idle_.load())
      static_cast<void>(poll_.wake()); // else the bounded poll ends it
  }

private:
  /// One connection to a peer: its frames in order and their
  /// acknowledgements. A batch's frames all go on one connection, so its
  /// immediate (on its last frame) follows every byte of it.
  struct wire_conn {
    unique_fd fd;
    bool writable = false;
    std::deque<slice> queue;    ///< Not yet (fully) written.
    std::deque<slice> inflight; ///< Written, awaiting an ack (in order).
    std::array<uint8_t, 64 * sizeof(wire::ack)> ack_buf{};
    size_t ack_have = 0;
    uint64_t next_seq = 1;
  };

  /// The lane's view of one peer: its connections of this class (kv:
  /// `tcp_kv_connections`, each opened once it has a batch to carry).
  struct lane_peer {
    link_ptr link;
    std::string host;
    uint16_t port = 0;
    std::vector<wire_conn> conns;
    size_t next = 0; ///< The connection pump() looks at first.
  };

  lane_peer& peer_of(const link_ptr& link) {
    auto i = index_.find(link.get());
    if (i != index_.end())
      return *peers_[i->second];
    peers_.push_back(std::make_unique<lane_peer>());
    peers_.back()->link = link;
    peers_.back()->conns.resize(conns_per_peer_);
    index_.emplace(link.get(), peers_.size() - 1);
    return *peers_.back();
  }

  /// The connection with the fewest frames queued or unacknowledged.
  static wire_conn& least_loaded(lane_peer& p) {
    return *std::min_element(p.conns.begin(), p.conns.end(),
                             [](const auto& x, const auto& y) {
                               return x.queue.size() + x.inflight.size()
                                      < y.queue.size() + y.inflight.size();
                             });
  }

  void take_inbox() {
    std::vector<command> cmds;
    {
      std::lock_guard<std::mutex> guard{inbox_mtx_};
      cmds.swap(inbox_);
    }
    for (auto& cmd : cmds) {
      if (cmd.what == command::kind::cancel) {
        cancel(cmd.region);
        continue;
      }
      auto& p = peer_of(cmd.link);
      switch (cmd.what) {
        case command::kind::address:
          p.host = std::move(cmd.host);
          p.port = cmd.port;
          break;
        case command::kind::drop:
          fail_peer(p,
                    caf::make_error(transport_errc::peer_lost, "peer dropped"));
          break;
        case command::kind::cancel:
          break; // handled above
        case command::kind::post: {
          auto& w = least_loaded(p);
          for (auto& s : cmd.slices) {
            s.hdr.seq = w.next_seq++;
            w.queue.push_back(std::move(s));
          }
          batches_.push_back(std::move(cmd.b));
          break;
        }
      }
    }
  }

  void finish(batch_state& b, caf::error err) {
    if (b.done)
      return;
    b.done = true;
    // No slice of it is written from now on (a partly written one closes
    // its connection, see check_deadlines and on_ack): its sources may go.
    b.sources.clear();
    b.link->pending[static_cast<size_t>(tc_)].fetch_sub(1);
    auto& s = ctx_.stats;
    if (err) {
      s.batches_failed += 1;
      auto code = static_cast<transport_errc>(err.code());
      if (code == transport_errc::deadline_exceeded)
        s.deadline_exceeded += 1;
      else if (code == transport_errc::peer_lost)
        s.peer_lost += 1;
    } else {
      s.batches_completed += 1;
    }
    completion res{b.tag, b.acked_bytes, err ? b.ops : 0, std::move(err)};
    done_.emplace_back(std::move(b.sink), std::move(res));
  }

  /// Whether some connection of `p` can write now.
  static bool can_write(const wire_conn& w) {
    return w.fd && w.writable && !w.queue.empty();
  }

  /// Closes one connection of `p` and fails every batch with a slice on it
  /// (the peer's other connections carry on).
  void fail_conn(lane_peer& p, wire_conn& w, const caf::error& err) {
    if (w.fd)
      static_cast<void>(poll_.remove(w.fd.get())); // closing unwatches too
    w.fd.reset();
    w.writable = false;
    w.ack_have = 0;
    for (auto* q : {&w.inflight, &w.queue})
      for (auto& s : *q)
        finish(*s.b, err);
    w.inflight.clear();
    w.queue.clear();
    bool ready = std::any_of(p.conns.begin(), p.conns.end(), can_write);
    if (p.link->arbiter.set_ready(static_cast<size_t>(tc_), ready, clock_ns()))
      other_->poke();
  }

  /// Closes every connection of `p`, failing every batch on them.
  void fail_peer(lane_peer& p, const caf::error& err) {
    for (auto& w : p.conns)
      fail_conn(p, w, err);
  }

  /// Epoll token of connection `ci` of peer `pi`; never poller::wake_token.
  uint64_t token_of(size_t pi, size_t ci) const {
    return uint64_t{pi} * conns_per_peer_ + ci;
  }

  void connect_needed() {
    const auto& opts = ctx_.opts;
    for (size_t pi = 0; pi < peers_.size(); ++pi) {
      auto& p = *peers_[pi];
      for (size_t ci = 0; ci < p.conns.size(); ++ci) {
        auto& w = p.conns[ci];
        if (w.fd || w.queue.empty())
          continue;
        dial_request req{p.host,    p.port,      tc_,
                         opts.node, opts.secret, opts.io_timeout};
        ctx_.stats.connects += 1;
        auto fd = dial(req);
        if (fd)
          if (auto err = apply_socket_policy(fd->get(), opts, tc_))
            fd = std::move(err);
        if (fd)
          if (auto err = poll_.add(fd->get(), EPOLLIN | EPOLLOUT | EPOLLET,
                                   token_of(pi, ci)))
            fd = std::move(err);
        if (!fd) {
          fail_conn(p, w, fd.error());
          continue;
        }
        w.fd = std::move(*fd);
        w.writable = true;
        w.ack_have = 0;
      }
    }
  }

  /// Reads acknowledgements until the socket has none.
  void read_acks(lane_peer& p, wire_conn& w) {
    const auto& name = p.link->name;
    constexpr size_t ack_len = sizeof(wire::ack);
    for (;;) {
      if (!w.fd)
        return;
      // Several acknowledgements per call; a short read drained the socket.
      auto asked = w.ack_buf.size() - w.ack_have;
      auto r = recv_some(w.fd.get(), w.ack_buf.data() + w.ack_have, asked);
      if (r.status == io_status::would_block)
        return;
      if (r.status != io_status::progress) {
        auto why = "connection to " + name + " lost";
        if (r.error)
          why += ": " + to_string(r.error);
        fail_conn(p, w, caf::make_error(transport_errc::peer_lost, why));
        return;
      }
      w.ack_have += r.bytes;
      size_t used = 0;
      for (; used + ack_len <= w.ack_have; used += ack_len) {
        wire::ack a;
        std::memcpy(&a, w.ack_buf.data() + used, ack_len);
        if (!on_ack(p, w, a))
          return; // the connection failed
      }
      std::memmove(w.ack_buf.data(), w.ack_buf.data() + used,
                   w.ack_have - used);
      w.ack_have -= used;
      if (r.bytes < asked)
        return;
    }
  }

  /// Applies one acknowledgement; false when it was garbled (the
  /// connection is then failed).
  bool on_ack(lane_peer& p, wire_conn& w, const wire::ack& a) {
    const auto& name = p.link->name;
    if (a.magic != wire::ack_magic || w.inflight.empty()
        || a.seq != w.inflight.front().hdr.seq) {
      fail_conn(p, w,
                caf::make_error(transport_errc::bad_frame,
                                "garbled acknowledgement from " + name));
      return false;
    }
    auto s = std::move(w.inflight.front());
    w.inflight.pop_front();
    auto& b = *s.b;
    if (b.done)
      return true;
    if (a.status != 0) {
      finish(b, caf::make_error(static_cast<transport_errc>(a.status),
                                "write rejected by " + name));
      // A later frame of it partly written reads memory the caller may now
      // free: close that connection (it reconnects on next use).
      if (!w.queue.empty() && w.queue.front().b.get() == &b
          && w.queue.front().sent > 0) {
        fail_conn(p, w,
                  caf::make_error(transport_errc::peer_lost,
                                  "connection closed after a rejected write "
                                  "mid-frame"));
        return false;
      }
      return true;
    }
    b.acked_bytes += s.hdr.length;
    if (--b.slices_left == 0)
      finish(b, caf::none);
    return true;
  }

  /// Writes up to `budget` payload bytes of `w`'s front slice, and its
  /// header's rest with them (wire::next_send_call); returns bytes written.
  size_t write_some(lane_peer& p, wire_conn& w, size_t budget) {
    auto& s = w.queue.front();
    const size_t total = sizeof(wire::frame_header) + s.hdr.length;
    const auto call = wire::next_send_call(s.sent, s.hdr.length, budget);
    iovec iov[2];
    size_t cnt = 0;
    if (call.header > 0) {
      iov[cnt].iov_base =
          reinterpret_cast<uint8_t*>(&s.hdr) + call.header_offset;
      iov[cnt].iov_len = call.header;
      ++cnt;
    }
    if (call.payload > 0) {
      iov[cnt].iov_base = const_cast<uint8_t*>(s.src + call.payload_offset);
      iov[cnt].iov_len = call.payload;
      ++cnt;
    }
    auto r = sendmsg_some(w.fd.get(), iov, cnt);
    if (r.status == io_status::would_block) {
      w.writable = false;
      return 0;
    }
    if (r.status != io_status::progress) {
      fail_conn(p, w,
                caf::make_error(transport_errc::peer_lost,
                                "send to " + p.link->name + ": "
                                    + to_string(r.error)));
      return 0;
    }
    s.sent += r.bytes;
    if (s.sent == total) {
      w.inflight.push_back(std::move(s));
      w.queue.pop_front();
    }
    return r.bytes;
  }

  /// The next connection of `p` that can write, taking turns (one grant
  /// each); null when none can.
  wire_conn* next_writer(lane_peer& p) {
    const auto n = p.conns.size();
    for (size_t k = 0; k < n; ++k) {
      auto ci = (p.next + k) % n;
      if (can_write(p.conns[ci])) {
        p.next = (ci + 1) % n;
        return &p.conns[ci];
      }
    }
    return nullptr;
  }

  /// Sends for one pass; true when the pass ended on its budget (come back
  /// without waiting). `refused_` is set when the arbiter made us wait.
  bool pump(lane_peer& p) {
    const auto c = static_cast<size_t>(tc_);
    auto& arb = p.link->arbiter;
    size_t budget = pass_budget;
    while (budget > 0) {
      // Skip slices of batches that already failed (deadline), unless they
      // are partly written: those keep the stream framed.
      for (auto& w : p.conns)
        while (!w.queue.empty() && w.queue.front().b->done
               && w.queue.front().sent == 0)
          w.queue.pop_front();
      auto* w = next_writer(p);
      bool ready = w != nullptr;
      auto now = clock_ns();
      if (arb.set_ready(c, ready, now))
        other_->poke();
      if (!ready)
        return false;
      // Per grant: kv grants shrink as soon as control traffic shows up.
      const auto lone = syscall_chunk(ctx_, tc_, pass_budget, now);
      auto g = arb.acquire(c, std::min(quantum, lone), lone, now);
      if (g.wake_other)
        other_->poke();
      if (g.bytes == 0) {
        refused_ = true;
        return false;
      }
      auto n = write_some(p, *w, g.bytes);
      if (g.contended)
        arb.settle(c, g.bytes, n);
      budget -= std::min(budget, n);
      ctx_.stats.bytes_sent[c] += n;
      if (g.contended)
        ctx_.stats.contended_bytes[c] += n;
    }
    return true;
  }

  /// Fails pending batch `b` with `err`; a partly written slice of it
  /// would read memory the caller may now free, so its connection closes
  /// (it reconnects on next use).
  void abort_batch(batch_state& b, caf::error err, const char* why) {
    finish(b, std::move(err));
    auto& p = peer_of(b.link);
    for (auto& w : p.conns)
      if (!w.queue.empty() && w.queue.front().b.get() == &b
          && w.queue.front().sent > 0)
        fail_conn(p, w, caf::make_error(transport_errc::peer_lost, why));
  }

  void check_deadlines() {
    auto now = clock_type::now();
    for (auto i = batches_.begin(); i != batches_.end();) {
      auto& b = **i;
      if (!b.done && now >= b.deadline)
        abort_batch(b,
                    caf::make_error(transport_errc::deadline_exceeded,
                                    "batch " + std::to_string(b.tag)
                                        + " missed its deadline"),
                    "connection closed after a deadline mid-frame");
      if (b.done)
        i = batches_.erase(i);
      else
        ++i;
    }
  }

  /// Fails the pending batches that read from local region `region`.
  void cancel(uint32_t region) {
    for (auto& bp : batches_) {
      auto& b = *bp;
      if (b.done
          || std::none_of(b.sources.begin(), b.sources.end(),
                          [region](auto& s) { return s.id() == region; }))
        continue;
      abort_batch(b,
                  caf::make_error(
                      transport_errc::unknown_region,
                      "batch " + std::to_string(b.tag) + ": its source region "
                          + std::to_string(region) + " was deregistered"),
                  "connection closed after a deregistered source mid-frame");
    }
  }

  void deliver() {
    auto done = std::move(done_);
    done_.clear();
    for (auto& [sink, res] : done)
      if (sink)
        sink(std::move(res));
  }

  void run() {
    std::array<epoll_event, 64> events;
    bool more = false;
    while (!stop_) {
      // Deadlines are checked every 5 ms while batches are pending; a lane
      // the arbiter made wait looks again within the arbiter's stale time.
      int timeout = more ? 0 : refused_ ? 1 : batches_.empty() ? 100 : 5;
      refused_ = false;
      caf::expected<int> n = 0;
      if (timeout > 0 && spin_.count() > 0 && !batches_.empty()) {
        // A transfer is under way: its acknowledgements and send space
        // come within microseconds; polling for them saves the wake-ups.
        // (Posters see idle_ false and only set poked_, checked here.)
        n = poll_.spin(
            events.data(), static_cast<int>(events.size()), spin_,
            [this] { return poked_.load() || stop_.load(); }, spins_);
        if (n && (*n > 0 || poked_.load()))
          ctx_.stats.kv_spin_hits += 1;
        if (!n)
          n = 0; // then the wait below
      }
      if (*n == 0) {
        // Every pass reads its sockets, a poked one without sleeping.
        if (timeout > 0) {
          idle_.store(true);
          if (poked_.load())
            timeout = 0;
        }
        if (timeout > 0 && tc_ == traffic_class::kv)
          ctx_.stats.kv_sleeps += 1;
        n = poll_.wait(events.data(), static_cast<int>(events.size()), timeout);
      }
      idle_.store(false);
      poked_.store(false);
      for (int i = 0; n && i < *n; ++i) {
        auto token = events[i].data.u64;
        if (token == poller::wake_token) {
          static_cast<void>(poll_.drain_wake()); // level-triggered: retried
          continue;
        }
        auto& p = *peers_[static_cast<size_t>(token / conns_per_peer_)];
        auto& w = p.conns[static_cast<size_t>(token % conns_per_peer_)];
        if (events[i].events & EPOLLOUT)
          w.writable = true;
        if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
          read_acks(p, w);
      }
      take_inbox();
      check_deadlines();
      connect_needed();
      more = false;
      for (auto& p : peers_)
        more = pump(*p) || more;
      deliver();
    }
  }

  tcp_context& ctx_;
  const traffic_class tc_;
  /// How long this lane polls before it sleeps (kv only, see options).
  const std::chrono::nanoseconds spin_;
  uint64_t spins_ = 0;
  /// Connections per peer (kv: tcp_kv_connections; control: 1).
  const size_t conns_per_peer_;
  lane* other_ = nullptr;

  // Shared with posters.
  std::mutex inbox_mtx_; // guards registry_, inbox_ and stopped_
  std::unordered_map<std::string, link_ptr> registry_;
  std::vector<command> inbox_;
  bool stopped_ = false;
  std::atomic<bool> poked_{false};
  std::atomic<bool> idle_{false};
  std::atomic<bool> stop_{false};
  poller poll_;

  // The lane thread's own (and join()'s, after the thread ended).
  std::vector<std::unique_ptr<lane_peer>> peers_;
  std::unordered_map<const peer_link*, size_t> index_;
  std::list<batch_ptr> batches_;
  std::vector<std::pair<completion_sink, completion>> done_;
  bool refused_ = false;
  std::thread thread_;
};

tcp_sender::tcp_sender(tcp_context& ctx) : ctx_(ctx) {
  for (size_t c = 0; c < traffic_class_count; ++c)
    lanes_[c] = std::make_unique<lane>(ctx_, static_cast<traffic_class>(c));
  lanes_[0]->set_other(lanes_[1].get());
  lanes_[1]->set_other(lanes_[0].get());
}

tcp_sender::~tcp_sender() {
  stop();
}

caf::error tcp_sender::start() {
  for (auto& l : lanes_)
    if (auto err = l->open())
      return err;
  for (auto& l : lanes_)
    if (auto err = l->start())
      return err;
  return caf::none;
}

void tcp_sender::stop() {
  // Both lanes stop before either is drained: a lane pokes the other.
  for (auto& l : lanes_)
    l->request_stop();
  for (auto& l : lanes_)
    l->join();
}

void tcp_sender::set_address(const std::string& peer, std::string host,
                             uint16_t port) {
  std::shared_ptr<peer_link> link;
  {
    std::lock_guard<std::mutex> guard{links_mtx_};
    auto& x = links_[peer];
    if (!x)
      x = std::make_shared<peer_link>(peer, ctx_.opts.weight_control,
                                      ctx_.opts.weight_kv);
    link = x;
  }
  for (auto& l : lanes_)
    l->set_address(link, host, port);
}

caf::error tcp_sender::enqueue(const batch& b, completion_sink& sink) {
  if (b.tclass == traffic_class::control)
    ctx_.note_control(clock_ns());
  return lanes_[static_cast<size_t>(b.tclass)]->enqueue(b, sink);
}

void tcp_sender::drop_peer(const std::string& peer) {
  for (auto& l : lanes_)
    l->drop_peer(peer);
}

void tcp_sender::cancel_source(uint32_t region_id) {
  for (auto& l : lanes_)
    l->cancel_source(region_id);
}

} // namespace dualpath::transport::bulk
