#include "transport/bulk/tcp_sender.hpp"

#include <array>
#include <cstring>
#include <deque>

#include "transport/bulk/tcp_handshake.hpp"
#include "transport/bulk/tcp_wire.hpp"
#include "transport/bulk/wrr.hpp"

namespace dualpath::transport::bulk {

struct tcp_sender::batch_state {
  uint64_t tag = 0;
  completion_sink sink;
  clock_type::time_point deadline;
  uint32_t ops = 0;
  uint32_t slices_left = 0;
  uint64_t acked_bytes = 0;
  size_t peer = 0;
  traffic_class tclass = traffic_class::kv;
  bool done = false;
};

namespace {

using batch_ptr = std::shared_ptr<tcp_sender::batch_state>;

/// One frame: a header and the source bytes of its payload.
struct slice {
  batch_ptr b;
  wire::frame_header hdr;
  const uint8_t* src = nullptr;
  size_t sent = 0; ///< Header + payload bytes already written.
};

/// Epoll token of connection `c` of peer `pi`; never poller::wake_token,
/// since c < 0xff.
uint64_t token_of(size_t pi, size_t c) {
  return (uint64_t{pi} << 8) | c | (uint64_t{1} << 63);
}

} // namespace

struct tcp_sender::out_conn {
  unique_fd fd;
  bool writable = false;
  std::deque<slice> queue;    ///< Not yet (fully) written.
  std::deque<slice> inflight; ///< Written, awaiting an ack (in order).
  std::array<uint8_t, sizeof(wire::ack)> ack_buf{};
  size_t ack_have = 0;
  uint64_t next_seq = 1;
  clock_type::time_point retry_after{};
};

struct tcp_sender::peer_state {
  std::string name;
  std::string host;
  uint16_t port = 0;
  std::array<out_conn, traffic_class_count> conns;
  wrr_arbiter arbiter;
  size_t pending = 0; ///< Batches not yet completed.
  peer_state(uint32_t wc, uint32_t wk) : arbiter(wc, wk) {
    // nop
  }
};

tcp_sender::tcp_sender(tcp_context& ctx) : ctx_(ctx) {
  // nop
}

tcp_sender::~tcp_sender() {
  stop();
}

caf::error tcp_sender::start() {
  if (auto err = poll_.open())
    return err;
  thread_ = std::thread{[this] { run(); }};
  return caf::none;
}

void tcp_sender::stop() {
  stop_ = true;
  wake();
  if (thread_.joinable())
    thread_.join();
  // Every batch still pending completes with an error (no op stays in
  // flight forever).
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& p : peers_)
      for (auto& c : p->conns)
        fail_conn(c, transport_errc::peer_lost, "backend shut down");
  }
  deliver();
}

void tcp_sender::wake() {
  // A lost wake-up costs at most one 5 ms poll interval.
  static_cast<void>(poll_.wake());
}

void tcp_sender::set_address(const std::string& peer, std::string host,
                             uint16_t port) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = peer_index_.find(peer);
  if (i == peer_index_.end()) {
    peers_.push_back(std::make_unique<peer_state>(ctx_.opts.weight_control,
                                                  ctx_.opts.weight_kv));
    i = peer_index_.emplace(peer, peers_.size() - 1).first;
  }
  auto& p = *peers_[i->second];
  p.name = peer;
  p.host = std::move(host);
  p.port = port;
}

caf::error tcp_sender::enqueue(const batch& b, completion_sink& sink) {
  const auto& opts = ctx_.opts;
  // Frames never exceed the receiver's bound: large writes are sliced.
  const auto slice_len = std::max<uint64_t>(
      std::min(opts.slice_kib << 10, opts.max_frame_mib << 20), 1);
  std::unique_lock<std::mutex> guard{mtx_};
  auto i = peer_index_.find(b.writes.front().destination.node);
  if (i == peer_index_.end())
    return caf::make_error(transport_errc::peer_lost,
                           "unknown peer " + b.writes.front().destination.node);
  auto& p = *peers_[i->second];
  if (p.pending >= opts.max_pending_batches)
    return caf::make_error(transport_errc::queue_full,
                           "too many pending batches to " + p.name);
  auto st = std::make_shared<batch_state>();
  st->tag = b.tag;
  st->sink = std::move(sink);
  st->deadline = b.deadline;
  st->ops = static_cast<uint32_t>(b.writes.size());
  st->peer = i->second;
  st->tclass = b.tclass;
  auto& conn = p.conns[static_cast<size_t>(b.tclass)];
  for (size_t wi = 0; wi < b.writes.size(); ++wi) {
    const auto& w = b.writes[wi];
    auto src = static_cast<const uint8_t*>(w.source->data()) + w.source_offset;
    uint64_t off = 0;
    do {
      auto n = std::min(slice_len, w.destination.length - off);
      slice s;
      s.b = st;
      s.src = src + off;
      s.hdr = wire::make_header(w.destination.region_id, w.destination.key,
                                w.destination.offset + off, n, b.tclass);
      bool last = wi + 1 == b.writes.size() && off + n == w.destination.length;
      if (last && b.immediate)
        wire::set_immediate(s.hdr, *b.immediate);
      s.hdr.seq = conn.next_seq++;
      conn.queue.push_back(std::move(s));
      ++st->slices_left;
      off += n;
    } while (off < w.destination.length);
  }
  ++p.pending;
  batches_.push_back(st);
  guard.unlock();
  ctx_.count(&counters::batches_posted);
  wake();
  return caf::none;
}

void tcp_sender::drop_peer(const std::string& peer) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = peer_index_.find(peer);
  if (i == peer_index_.end())
    return;
  for (auto& c : peers_[i->second]->conns)
    fail_conn(c, transport_errc::peer_lost, "peer dropped");
}

void tcp_sender::finish(batch_state& b, caf::error err) {
  if (b.done)
    return;
  b.done = true;
  --peers_[b.peer]->pending;
  completion res{b.tag, b.acked_bytes, err ? b.ops : 0, std::move(err)};
  ctx_.update([&](counters& s) {
    if (res.error) {
      ++s.batches_failed;
      auto code = static_cast<transport_errc>(res.error.code());
      if (code == transport_errc::deadline_exceeded)
        ++s.deadline_exceeded;
      else if (code == transport_errc::peer_lost)
        ++s.peer_lost;
    } else {
      ++s.batches_completed;
    }
  });
  done_.emplace_back(std::move(b.sink), std::move(res));
}

void tcp_sender::fail_conn(out_conn& c, transport_errc code,
                           const std::string& why) {
  fail_conn(c, caf::make_error(code, why));
}

void tcp_sender::fail_conn(out_conn& c, caf::error err) {
  if (c.fd)
    static_cast<void>(poll_.remove(c.fd.get())); // closing unwatches it too
  c.fd.reset();
  c.writable = false;
  c.ack_have = 0;
  for (auto* q : {&c.inflight, &c.queue})
    for (auto& s : *q)
      finish(*s.b, err);
  c.inflight.clear();
  c.queue.clear();
}

void tcp_sender::connect_needed(std::unique_lock<std::mutex>& guard) {
  auto now = clock_type::now();
  const auto& opts = ctx_.opts;
  for (size_t pi = 0; pi < peers_.size(); ++pi) {
    for (size_t c = 0; c < traffic_class_count; ++c) {
      auto& p = *peers_[pi];
      auto& conn = p.conns[c];
      if (conn.fd || conn.queue.empty() || now < conn.retry_after)
        continue;
      dial_request req{p.host,    p.port,      static_cast<traffic_class>(c),
                       opts.node, opts.secret, opts.io_timeout};
      guard.unlock();
      ctx_.count(&counters::connects);
      auto fd = dial(req);
      guard.lock();
      auto& conn2 = peers_[pi]->conns[c];
      if (fd) {
        if (auto err = poll_.add(fd->get(), EPOLLIN | EPOLLOUT | EPOLLET,
                                 token_of(pi, c)))
          fd = std::move(err);
      }
      if (!fd) {
        fail_conn(conn2, std::move(fd.error()));
        continue;
      }
      conn2.fd = std::move(*fd);
      conn2.writable = true;
      conn2.ack_have = 0;
    }
  }
}

void tcp_sender::read_acks(peer_state& p, out_conn& c) {
  for (;;) {
    if (!c.fd)
      return;
    auto r = recv_some(c.fd.get(), c.ack_buf.data() + c.ack_have,
                       c.ack_buf.size() - c.ack_have);
    if (r.status == io_status::would_block)
      return;
    if (r.status == io_status::closed) {
      fail_conn(c, transport_errc::peer_lost,
                "connection to " + p.name + " lost");
      return;
    }
    if (r.status == io_status::failed) {
      fail_conn(c, transport_errc::peer_lost,
                "connection to " + p.name + " lost: " + to_string(r.error));
      return;
    }
    c.ack_have += r.bytes;
    if (c.ack_have < c.ack_buf.size())
      continue;
    c.ack_have = 0;
    wire::ack a;
    std::memcpy(&a, c.ack_buf.data(), sizeof(a));
    if (a.magic != wire::ack_magic || c.inflight.empty()
        || a.seq != c.inflight.front().hdr.seq) {
      fail_conn(c, transport_errc::bad_frame,
                "garbled acknowledgement from " + p.name);
      return;
    }
    auto s = std::move(c.inflight.front());
    c.inflight.pop_front();
    auto& b = *s.b;
    if (b.done)
      continue;
    if (a.status != 0) {
      finish(b, caf::make_error(static_cast<transport_errc>(a.status),
                                "write rejected by " + p.name));
      continue;
    }
    b.acked_bytes += s.hdr.length;
    if (--b.slices_left == 0)
      finish(b, caf::none);
  }
}

size_t tcp_sender::write_some(peer_state& p, out_conn& c, size_t quantum) {
  auto& s = c.queue.front();
  const size_t hdr_len = sizeof(wire::frame_header);
  const size_t total = hdr_len + s.hdr.length;
  iovec iov[2];
  size_t cnt = 0;
  size_t budget = quantum;
  if (s.sent < hdr_len) {
    iov[cnt].iov_base = reinterpret_cast<uint8_t*>(&s.hdr) + s.sent;
    iov[cnt].iov_len = hdr_len - s.sent;
    budget -= std::min(budget, iov[cnt].iov_len);
    ++cnt;
    if (s.hdr.length > 0 && budget > 0) {
      iov[cnt].iov_base = const_cast<uint8_t*>(s.src);
      iov[cnt].iov_len = std::min<size_t>(s.hdr.length, budget);
      ++cnt;
    }
  } else {
    auto off = s.sent - hdr_len;
    iov[cnt].iov_base = const_cast<uint8_t*>(s.src + off);
    iov[cnt].iov_len = std::min<size_t>(s.hdr.length - off, quantum);
    ++cnt;
  }
  auto r = sendmsg_some(c.fd.get(), iov, cnt);
  if (r.status == io_status::would_block) {
    c.writable = false;
    return 0;
  }
  if (r.status != io_status::progress) {
    fail_conn(c, transport_errc::peer_lost,
              "send to " + p.name + ": " + to_string(r.error));
    return 0;
  }
  s.sent += r.bytes;
  if (s.sent == total) {
    c.inflight.push_back(std::move(s));
    c.queue.pop_front();
  }
  return r.bytes;
}

bool tcp_sender::pump(peer_state& p) {
  constexpr size_t quantum = 64 * 1024;
  constexpr size_t lone_grant = 256 * 1024;
  size_t budget = 1024 * 1024; // per peer per pass
  while (budget > 0) {
    std::array<bool, traffic_class_count> eligible{};
    bool any = false;
    for (size_t c = 0; c < traffic_class_count; ++c) {
      auto& conn = p.conns[c];
      // Skip slices of batches that already failed (deadline), unless they
      // are partly written: those keep the stream framed.
      while (!conn.queue.empty() && conn.queue.front().b->done
             && conn.queue.front().sent == 0)
        conn.queue.pop_front();
      eligible[c] = conn.fd && conn.writable && !conn.queue.empty();
      any = any || eligible[c];
    }
    if (!any)
      return false;
    // The arbiter shapes only contention: with both classes able to send
    // it picks by weighted bytes in small grants (so control bytes are
    // interleaved finely) and is charged; a lone class sends larger
    // grants uncharged (work-conserving, and no credit is banked for idle
    // or blocked periods).
    bool contended = eligible[0] && eligible[1];
    auto c = contended ? p.arbiter.pick(eligible) : (eligible[0] ? 0 : 1);
    auto n = write_some(p, p.conns[c], contended ? quantum : lone_grant);
    if (contended)
      p.arbiter.charge(c, n);
    budget -= std::min(budget, n);
    ctx_.update([&](counters& s) {
      s.bytes_sent[c] += n;
      if (contended)
        s.contended_bytes[c] += n;
    });
  }
  return true;
}

void tcp_sender::check_deadlines() {
  auto now = clock_type::now();
  for (auto i = batches_.begin(); i != batches_.end();) {
    auto& b = **i;
    if (!b.done && now >= b.deadline) {
      finish(b, caf::make_error(transport_errc::deadline_exceeded,
                                "batch " + std::to_string(b.tag)
                                    + " missed its deadline"));
      // A partly written slice of this batch reads memory the caller may
      // now free: close that connection (it reconnects on next use).
      auto& c = peers_[b.peer]->conns[static_cast<size_t>(b.tclass)];
      if (!c.queue.empty() && c.queue.front().b.get() == &b
          && c.queue.front().sent > 0)
        fail_conn(c, transport_errc::peer_lost,
                  "connection closed after a deadline mid-frame");
    }
    if (b.done)
      i = batches_.erase(i);
    else
      ++i;
  }
}

void tcp_sender::deliver() {
  std::vector<std::pair<completion_sink, completion>> done;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    done.swap(done_);
  }
  for (auto& [sink, res] : done)
    if (sink)
      sink(std::move(res));
}

void tcp_sender::run() {
  std::array<epoll_event, 64> events;
  bool more = false;
  while (!stop_) {
    auto n = poll_.wait(events.data(), static_cast<int>(events.size()),
                        more ? 0 : 5);
    std::unique_lock<std::mutex> guard{mtx_};
    for (int i = 0; n && i < *n; ++i) {
      auto tag = events[i].data.u64;
      if (tag == poller::wake_token) {
        static_cast<void>(poll_.drain_wake()); // level-triggered: retried
        continue;
      }
      auto pi = static_cast<size_t>((tag & ~(uint64_t{1} << 63)) >> 8);
      auto c = static_cast<size_t>(tag & 0xff);
      auto& p = *peers_[pi];
      auto& conn = p.conns[c];
      if (events[i].events & EPOLLOUT)
        conn.writable = true;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        read_acks(p, conn);
    }
    check_deadlines();
    connect_needed(guard);
    more = false;
    for (auto& p : peers_)
      more = pump(*p) || more;
    auto done = std::move(done_);
    done_.clear();
    guard.unlock();
    for (auto& [sink, res] : done)
      if (sink)
        sink(std::move(res));
  }
}

} // namespace dualpath::transport::bulk
