#include "transport/bulk/tcp_receiver.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/bulk/tcp_class_policy.hpp"
#include "transport/bulk/tcp_handshake.hpp"
#include "transport/bulk/tcp_wire.hpp"

namespace dualpath::transport::bulk {

namespace {

enum class in_state { auth, header, payload, discard };

/// One inbound connection.
struct in_conn {
  unique_fd fd;
  in_state st = in_state::auth;
  traffic_class tclass = traffic_class::control;
  std::string peer;
  uint64_t serial = 0; ///< Order of acceptance (tcp_receiver::accepted_).
  nonce sent{};
  std::array<uint8_t, sizeof(wire::hello)> buf{};
  size_t have = 0;
  wire::frame_header hdr{};
  region_table::pin pin;
  uint64_t done = 0;
  transport_errc verdict = transport_errc::none;
  std::vector<uint8_t> out;  ///< Unsent acknowledgements.
  bool watching_out = false; ///< EPOLLOUT requested (out did not fit).
  size_t lowat = 1;          ///< The socket's SO_RCVLOWAT.
  clock_type::time_point last_progress;
  bool dead = false;
};

template <class T>
void append(std::vector<uint8_t>& out, const T& x) {
  auto p = reinterpret_cast<const uint8_t*>(&x);
  out.insert(out.end(), p, p + sizeof(x));
}

} // namespace

/// One receive thread: epoll over inbound connections (and the listener for
/// the control loop).
class tcp_receiver::loop {
public:
  loop(tcp_context& ctx, tcp_receiver& owner, traffic_class tc)
      : ctx_(ctx),
        owner_(owner),
        tc_(tc),
        spin_(tc == traffic_class::kv ? ctx.opts.tcp_kv_spin
                                      : std::chrono::microseconds{0}),
        lowat_cap_(receive_wait_cap(ctx.opts, tc)) {
    // nop
  }

  caf::error start(int listen_fd);
  void stop();

  /// Hands over an authenticated connection (from the control loop).
  void adopt(std::unique_ptr<in_conn> c);

  /// Closes this loop's connections of `peer`; with `wait`, returns once
  /// the thread no longer reads them (or has stopped). From the loop's own
  /// thread it only marks them, and the current pass stops reading them.
  void drop_peer(const std::string& peer, bool wait);

  /// True when called on this loop's thread.
  bool on_own_thread() const {
    return std::this_thread::get_id() == thread_.get_id();
  }

private:
  /// A drop_peer() waiting for this loop's thread.
  struct drop_request {
    std::string peer;
    bool done = false;
  };

  void run();
  void serve_drops();
  void close_now(int fd);
  void add(std::unique_ptr<in_conn> c);
  void on_readable(in_conn& c);
  bool set_lowat(in_conn& c);
  void drop(in_conn& c);
  bool flush(in_conn& c);
  void accept_all();
  /// Drops connections stalled mid-frame past io_timeout at `now`; true
  /// when a live connection is mid-frame (its sender is writing the rest).
  bool check_timeouts(clock_type::time_point now);
  bool handle_auth(in_conn& c);
  bool handle_header(in_conn& c);
  void finish_frame(in_conn& c);

  tcp_context& ctx_;
  tcp_receiver& owner_;
  traffic_class tc_;
  /// How long this loop polls before it sleeps once data came, mid-frame
  /// (kv only: tcp_kv_spin_us).
  const std::chrono::nanoseconds spin_;
  /// ... and at most this long between frames.
  static constexpr std::chrono::nanoseconds between_frames_spin =
      std::chrono::microseconds{100};
  /// The most payload bytes a connection waits for before it is read
  /// (receive_wait_cap).
  const size_t lowat_cap_;
  clock_type::time_point spin_until_{};
  uint64_t spins_ = 0;
  int listen_fd_ = -1;
  poller poll_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex adopt_mtx_;
  std::vector<std::unique_ptr<in_conn>> adopted_;
  // Drop requests, under adopt_mtx_; `has_drops_` spares the lock per pass.
  std::vector<std::shared_ptr<drop_request>> drops_;
  std::atomic<bool> has_drops_{false};
  bool stopped_ = false; ///< Under adopt_mtx_: no request is served anymore.
  std::condition_variable drops_cv_;
  std::unordered_map<int, std::unique_ptr<in_conn>> conns_;
  std::vector<int> doomed_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(64 * 1024);
};

// -- tcp_receiver -------------------------------------------------------------

tcp_receiver::tcp_receiver(tcp_context& ctx) : ctx_(ctx) {
  // nop
}

tcp_receiver::~tcp_receiver() {
  stop();
}

caf::error tcp_receiver::start() {
  const auto& opts = ctx_.opts;
  auto fd = tcp_socket();
  if (!fd)
    return std::move(fd.error());
  listen_ = std::move(*fd);
  if (auto err = set_reuseaddr(listen_.get()))
    return err;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(opts.listen_port);
  if (::inet_pton(AF_INET, opts.listen_host.c_str(), &addr.sin_addr) != 1)
    return caf::make_error(transport_errc::bad_config,
                           "transport.tcp_listen host is not an IPv4 address: "
                               + opts.listen_host);
  if (auto err = sys_check("bind", ::bind(listen_.get(),
                                          reinterpret_cast<sockaddr*>(&addr),
                                          sizeof(addr))))
    return err;
  if (auto err = sys_check("listen", ::listen(listen_.get(), 128)))
    return err;
  socklen_t len = sizeof(addr);
  if (auto err =
          sys_check("getsockname",
                    ::getsockname(listen_.get(),
                                  reinterpret_cast<sockaddr*>(&addr), &len)))
    return err;
  port_ = ntohs(addr.sin_port);
  if (auto err = set_nonblocking(listen_.get()))
    return err;
  // Every loop exists and runs before the accepting one (control) starts:
  // it hands a connection to its class's loop at once (the TSan build found
  // both races when a peer connected during start-up, commit 5248408).
  for (size_t c = 0; c < traffic_class_count; ++c)
    loops_[c] =
        std::make_unique<loop>(ctx_, *this, static_cast<traffic_class>(c));
  for (size_t c = traffic_class_count; c-- > 0;)
    if (auto err = loops_[c]->start(c == 0 ? listen_.get() : -1))
      return err;
  return caf::none;
}

void tcp_receiver::stop() {
  for (auto& l : loops_)
    if (l)
      l->stop();
}

void tcp_receiver::drop_peer(const std::string& peer) {
  {
    // First the mark: a connection of `peer` accepted before now that a
    // loop adds or authenticates from here on is closed there, so none
    // slips between the loops while they serve the request.
    std::lock_guard<std::mutex> guard{marks_mtx_};
    marks_[peer] = accepted_.load();
  }
  // From a receive thread (an immediate handler) waiting for the other
  // loop could wait for a handler of its own that waits for us.
  bool inside = false;
  for (auto& l : loops_)
    inside = inside || (l && l->on_own_thread());
  for (auto& l : loops_)
    if (l)
      l->drop_peer(peer, !inside);
}

bool tcp_receiver::dropped(const std::string& peer, uint64_t serial) {
  std::lock_guard<std::mutex> guard{marks_mtx_};
  auto i = marks_.find(peer);
  return i != marks_.end() && serial < i->second;
}

// -- loop ---------------------------------------------------------------------

caf::error tcp_receiver::loop::start(int listen_fd) {
  listen_fd_ = listen_fd;
  if (auto err = poll_.open())
    return err;
  if (listen_fd_ >= 0)
    if (auto err =
            poll_.add(listen_fd_, EPOLLIN, static_cast<uint64_t>(listen_fd_)))
      return err;
  return start_class_thread(thread_, ctx_.opts, tc_,
                            tc_ == traffic_class::control ? "dp-tcp-rx-ctl"
                                                          : "dp-tcp-rx-kv",
                            [this] { run(); });
}

void tcp_receiver::loop::stop() {
  stop_ = true;
  static_cast<void>(poll_.wake()); // no wake-up: the 20 ms poll ends it
  if (thread_.joinable())
    thread_.join();
  conns_.clear();
  std::lock_guard<std::mutex> guard{adopt_mtx_};
  adopted_.clear();
  stopped_ = true; // every connection is closed: nothing left to wait for
  for (auto& r : drops_)
    r->done = true;
  drops_.clear();
  drops_cv_.notify_all();
}

void tcp_receiver::loop::drop_peer(const std::string& peer, bool wait) {
  if (on_own_thread()) {
    // From an immediate handler of this very thread: waiting would wait
    // for ourselves. Marking is enough: on_readable() stops at a dead
    // connection once the handler returns, and the pass closes it.
    for (auto& [fd, c] : conns_)
      if (c->st != in_state::auth && c->peer == peer)
        drop(*c);
    return;
  }
  auto req = std::make_shared<drop_request>();
  req->peer = peer;
  std::unique_lock<std::mutex> guard{adopt_mtx_};
  if (stopped_)
    return;
  drops_.push_back(req);
  has_drops_ = true;
  // A failed wake-up costs at most the 20 ms poll.
  static_cast<void>(poll_.wake());
  if (wait)
    drops_cv_.wait(guard, [&] { return req->done; });
}

void tcp_receiver::loop::serve_drops() {
  std::vector<std::shared_ptr<drop_request>> reqs;
  std::vector<std::unique_ptr<in_conn>> got;
  {
    std::lock_guard<std::mutex> guard{adopt_mtx_};
    reqs.swap(drops_);
    got.swap(adopted_);
    has_drops_ = false;
  }
  // Handed-over connections first (add() closes those the mark covers).
  for (auto& c : got)
    add(std::move(c));
  std::vector<int> victims;
  for (auto& r : reqs)
    for (auto& [fd, c] : conns_)
      if (c->st != in_state::auth && c->peer == r->peer)
        victims.push_back(fd);
  for (auto fd : victims)
    close_now(fd);
  std::lock_guard<std::mutex> guard{adopt_mtx_};
  for (auto& r : reqs)
    r->done = true;
  drops_cv_.notify_all();
}

void tcp_receiver::loop::close_now(int fd) {
  auto i = conns_.find(fd);
  if (i == conns_.end())
    return;
  if (i->second->dead)
    return; // in doomed_: closed at the end of this pass
  static_cast<void>(poll_.remove(fd));
  conns_.erase(i); // unpins and closes
}

void tcp_receiver::loop::adopt(std::unique_ptr<in_conn> c) {
  {
    std::lock_guard<std::mutex> guard{adopt_mtx_};
    adopted_.push_back(std::move(c));
  }
  static_cast<void>(poll_.wake()); // no wake-up: the 20 ms poll takes it
}

void tcp_receiver::loop::add(std::unique_ptr<in_conn> c) {
  if (c->st != in_state::auth && owner_.dropped(c->peer, c->serial))
    return; // its peer was dropped while it was handed over: closed
  auto fd = c->fd.get();
  c->watching_out = !c->out.empty();
  uint32_t events = EPOLLIN | (c->watching_out ? EPOLLOUT : 0u);
  if (poll_.add(fd, events, static_cast<uint64_t>(fd)))
    return; // not watched: closing it tells the peer
  conns_[fd] = std::move(c);
}

void tcp_receiver::loop::run() {
  std::array<epoll_event, 64> events;
  while (!stop_) {
    caf::expected<int> n = 0;
    if (spin_.count() > 0 && clock_type::now() < spin_until_) {
      // Data came a moment ago (see the end of the pass): the rest of a
      // frame, or a stream's next frame, comes within microseconds; polling
      // for it saves the wake-up.
      n = poll_.spin(
          events.data(), static_cast<int>(events.size()),
          spin_until_ - clock_type::now(), [this] { return stop_.load(); },
          spins_);
      if (n && *n > 0)
        ctx_.stats.kv_spin_hits += 1;
    }
    if (n && *n == 0) {
      if (tc_ == traffic_class::kv)
        ctx_.stats.kv_sleeps += 1;
      n = poll_.wait(events.data(), static_cast<int>(events.size()), 20);
    }
    for (int i = 0; n && i < *n; ++i) {
      auto token = events[i].data.u64;
      if (token == poller::wake_token) {
        static_cast<void>(poll_.drain_wake()); // level-triggered: retried
        std::vector<std::unique_ptr<in_conn>> got;
        {
          std::lock_guard<std::mutex> guard{adopt_mtx_};
          got.swap(adopted_);
        }
        for (auto& c : got)
          add(std::move(c));
        continue;
      }
      auto fd = static_cast<int>(token);
      if (fd == listen_fd_) {
        accept_all();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end() || it->second->dead)
        continue;
      if (events[i].events & EPOLLOUT)
        flush(*it->second);
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        on_readable(*it->second);
    }
    // How long to poll before the next sleep: up to spin_ while a frame is
    // under way (part of it read, its sender writing the rest); between
    // frames at most between_frames_spin, which covers the next frame of a
    // stream (the sender's next write follows at once) but not the spell
    // after a stream's last frame, when polling would only burn the CPU
    // that the node's other kv work (storage and copy threads of the same
    // class) needs.
    auto now = clock_type::now();
    bool mid_frame = check_timeouts(now);
    if (spin_.count() > 0) {
      auto until =
          now + (mid_frame ? spin_ : std::min(spin_, between_frames_spin));
      spin_until_ = n && *n > 0 ? until : std::min(spin_until_, until);
    }
    for (auto fd : doomed_) {
      // The descriptor closes right after, which also unwatches it.
      static_cast<void>(poll_.remove(fd));
      conns_.erase(fd);
    }
    doomed_.clear();
    // After the pass: no read of this thread is under way.
    if (has_drops_.load())
      serve_drops();
  }
}

void tcp_receiver::loop::accept_all() {
  for (;;) {
    auto fd = sys_fd("accept4", ::accept4(listen_fd_, nullptr, nullptr,
                                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd)
      return; // EAGAIN: none left; others: retried on the next event
    ctx_.stats.connections_accepted += 1;
    // Handshake bytes travel as control; the class is known after it.
    if (set_nodelay(fd->get())
        || apply_socket_policy(fd->get(), ctx_.opts, traffic_class::control))
      continue; // closed: the client's handshake fails
    auto c = std::make_unique<in_conn>();
    c->serial = owner_.accepted_.fetch_add(1);
    c->fd = std::move(*fd);
    c->last_progress = clock_type::now();
    append(c->out, make_challenge(c->sent));
    auto* raw = c.get();
    auto raw_fd = raw->fd.get();
    add(std::move(c));
    if (conns_.count(raw_fd))
      flush(*raw);
  }
}

void tcp_receiver::loop::drop(in_conn& c) {
  if (c.dead)
    return;
  c.dead = true;
  c.pin.reset();
  doomed_.push_back(c.fd.get());
}

bool tcp_receiver::loop::flush(in_conn& c) {
  auto fd = c.fd.get();
  while (!c.out.empty()) {
    auto r = send_some(fd, c.out.data(), c.out.size());
    if (r.status == io_status::would_block) {
      if (!c.watching_out) {
        if (poll_.modify(fd, EPOLLIN | EPOLLOUT, static_cast<uint64_t>(fd))) {
          drop(c);
          return false;
        }
        c.watching_out = true;
      }
      return true;
    }
    if (r.status != io_status::progress) {
      drop(c);
      return false;
    }
    c.out.erase(c.out.begin(), c.out.begin() + r.bytes);
  }
  if (c.watching_out) {
    if (poll_.modify(fd, EPOLLIN, static_cast<uint64_t>(fd))) {
      drop(c);
      return false;
    }
    c.watching_out = false;
  }
  return true;
}

bool tcp_receiver::loop::check_timeouts(clock_type::time_point now) {
  bool mid_frame = false;
  for (auto& [fd, c] : conns_) {
    if (c->dead)
      continue;
    bool idle_ok = c->st == in_state::header && c->have == 0;
    if (!idle_ok && now - c->last_progress > ctx_.opts.io_timeout) {
      ctx_.stats.dropped_half_open += 1;
      drop(*c);
      continue;
    }
    mid_frame = mid_frame || !idle_ok;
  }
  return mid_frame;
}

bool tcp_receiver::loop::handle_auth(in_conn& c) {
  wire::hello h;
  std::memcpy(&h, c.buf.data(), sizeof(h));
  auto peer = check_hello(ctx_.opts.secret, c.sent, h);
  if (!peer) {
    ctx_.stats.rejected_unauthenticated += 1;
    auto w = refusal();
    // Best effort: the connection is dropped whether or not it arrives.
    static_cast<void>(send_some(c.fd.get(), &w, sizeof(w)));
    drop(c);
    return false;
  }
  if (owner_.dropped(peer->node, c.serial)) {
    // Opened before a drop_peer() of its node: the owner no longer trusts
    // what it would carry.
    auto w = refusal();
    static_cast<void>(send_some(c.fd.get(), &w, sizeof(w)));
    drop(c);
    return false;
  }
  c.peer = std::move(peer->node);
  c.tclass = peer->tclass;
  if (apply_socket_policy(c.fd.get(), ctx_.opts, c.tclass)) {
    drop(c);
    return false;
  }
  c.st = in_state::header;
  c.have = 0;
  append(c.out, peer->reply);
  if (!flush(c))
    return false;
  if (c.tclass != tc_) {
    // Hand the connection to its class's loop.
    auto it = conns_.find(c.fd.get());
    static_cast<void>(poll_.remove(c.fd.get())); // the other loop adds it
    auto owned = std::move(it->second);
    conns_.erase(it);
    owner_.loops_[static_cast<size_t>(owned->tclass)]->adopt(std::move(owned));
    return false;
  }
  return true;
}

bool tcp_receiver::loop::handle_header(in_conn& c) {
  // The same check the fuzz target exercises (fuzz/tcp_frames.cpp).
  auto parsed = wire::parse_frame_header(c.buf.data(), c.buf.size(),
                                         ctx_.opts.max_frame_mib << 20);
  if (!parsed) {
    // The stream can no longer be trusted to be framed: drop it.
    ctx_.stats.rejected_bad_frame += 1;
    drop(c);
    return false;
  }
  c.hdr = *parsed;
  auto& h = c.hdr;
  // A control frame (not a handshake, which every connection starts with
  // in this loop): kv calls stay short for a while (syscall_chunk).
  if (c.tclass == traffic_class::control)
    ctx_.note_control(clock_ns());
  c.done = 0;
  c.verdict =
      ctx_.regions.acquire(h.region_id, h.key, h.offset, h.length, c.pin);
  switch (c.verdict) {
    case transport_errc::none:
      break;
    case transport_errc::unknown_region:
      ctx_.stats.rejected_unknown_region += 1;
      break;
    case transport_errc::wrong_key:
      ctx_.stats.rejected_wrong_key += 1;
      break;
    default:
      ctx_.stats.rejected_out_of_bounds += 1;
      break;
  }
  c.st =
      c.verdict == transport_errc::none ? in_state::payload : in_state::discard;
  if (h.length == 0)
    finish_frame(c);
  return !c.dead; // dead: its immediate handler dropped the peer
}

void tcp_receiver::loop::finish_frame(in_conn& c) {
  bool ok = c.verdict == transport_errc::none;
  auto region = c.hdr.region_id;
  c.pin.reset();
  if (ok) {
    ctx_.stats.bytes_received += c.hdr.length;
    if (c.hdr.flags & wire::flag_immediate)
      ctx_.signal_immediate(
          incoming_immediate{c.peer, region, c.hdr.immediate});
  }
  wire::ack a{};
  a.magic = wire::ack_magic;
  a.status = static_cast<uint8_t>(c.verdict);
  a.seq = c.hdr.seq;
  append(c.out, a);
  c.st = in_state::header;
  c.have = 0;
  // Acknowledgements are flushed together when the read loop pauses.
}

void tcp_receiver::loop::on_readable(in_conn& c) {
  // Bounded work per wake-up so one busy peer cannot starve the others
  // (epoll is level-triggered, so the rest is read on the next round).
  size_t budget = 4 * 1024 * 1024;
  while (budget > 0) {
    io_result r;
    size_t asked = 0;
    if (c.st == in_state::auth || c.st == in_state::header) {
      size_t want = c.st == in_state::auth ? sizeof(wire::hello)
                                           : sizeof(wire::frame_header);
      asked = want - c.have;
      r = recv_some(c.fd.get(), c.buf.data() + c.have, asked);
      if (r.status == io_status::progress) {
        c.have += r.bytes;
        c.last_progress = clock_type::now();
        if (c.have == want) {
          bool go = c.st == in_state::auth ? handle_auth(c) : handle_header(c);
          if (!go)
            return;
        }
      }
    } else {
      auto left = c.hdr.length - c.done;
      // kv: short copies, so a waking control thread preempts within one.
      auto chunk_max = syscall_chunk(ctx_, tc_, budget, clock_ns());
      asked = std::min<uint64_t>(left, std::min(budget, chunk_max));
      if (c.st == in_state::payload) {
        // Straight into the registered region.
        r = recv_some(c.fd.get(), c.pin.ptr() + c.done, asked);
      } else {
        asked = std::min<uint64_t>(asked, scratch_.size());
        r = recv_some(c.fd.get(), scratch_.data(), asked);
      }
      if (r.status == io_status::progress) {
        c.done += r.bytes;
        budget -= std::min(budget, r.bytes);
        c.last_progress = clock_type::now();
        if (c.done == c.hdr.length) {
          finish_frame(c);
          if (c.dead)
            return; // its handler dropped the peer (loop::drop_peer)
        }
      }
    }
    if (r.status == io_status::would_block)
      break;
    if (r.status != io_status::progress) {
      drop(c);
      return;
    }
    // A short read drained the socket: wait instead of asking again.
    if (r.bytes < asked)
      break;
  }
  if (!c.dead && !c.out.empty() && !flush(c))
    return;
  if (!c.dead && !set_lowat(c))
    drop(c);
}

bool tcp_receiver::loop::set_lowat(in_conn& c) {
  // Wake up only when the bytes that let this connection progress are
  // there: the rest of a header, or the payload's next piece (at most
  // `lowat_cap_`). Never more than the peer is about to send, so no wait is
  // lost; a stalled peer still ends at the io timeout.
  size_t want = 1;
  if (c.st == in_state::auth)
    want = sizeof(wire::hello) - c.have;
  else if (c.st == in_state::header)
    want = sizeof(wire::frame_header) - c.have;
  else
    want = std::min<uint64_t>(c.hdr.length - c.done, lowat_cap_);
  want = std::max<size_t>(want, 1);
  if (want == c.lowat)
    return true;
  int v = static_cast<int>(want);
  if (sys_check(
          "setsockopt(SO_RCVLOWAT)",
          ::setsockopt(c.fd.get(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v))))
    return false;
  c.lowat = want;
  return true;
}

} // namespace dualpath::transport::bulk
