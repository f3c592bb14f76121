// The tcp backend: one-sided writes over real sockets.
//
// Wire: a connection per (peer, traffic class), so a kv backlog in the kernel's
// socket buffers never sits in front of control bytes (the tcp analogue of a
// queue pair per class). Connecting side proves it holds `transport.secret`
// with HMAC-SHA256 over the listener's nonce; the listener proves the same over
// the client's nonce. Then the client sends frames: a fixed header (magic,
// version, region id, key, offset, length, sequence, class, optional
// immediate) followed by `length` payload bytes. The receiver checks region,
// key and bounds from the header BEFORE reading the payload and then recv()s
// the payload straight into the registered region (no staging copy); a
// rejected frame's payload is discarded and answered with a typed negative
// acknowledgement. Garbage and oversized frames, failed authentication and
// connections stuck mid-handshake or mid-frame longer than
// `transport.io_timeout` are dropped and counted; other peers are unaffected.
//
// Threads: one sender thread (connects lazily, arbitrates between classes by
// weighted round robin over byte slices, writes with writev, reads acks,
// enforces deadlines) and one receive thread per class (the kv one runs at a
// low CPU priority so control frames are served first when cores are busy).
// post() only queues under a mutex.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"
#include "transport/bulk/tcp_wire.hpp"
#include "transport/bulk/wrr.hpp"

namespace dualpath::transport::bulk {

namespace {

using namespace std::chrono;

caf::error sys_error(const char* call, int err = errno) {
  return caf::make_error(transport_errc::system_error,
                         std::string{call} + ": " + std::strerror(err));
}

/// RAII file descriptor.
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
    reset(other.release());
    return *this;
  }
  ~unique_fd() {
    reset();
  }
  int get() const {
    return fd_;
  }
  int release() {
    auto fd = fd_;
    fd_ = -1;
    return fd;
  }
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

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Blocking full write/read with the socket's SO_*TIMEO bounds (handshake).
bool write_all(int fd, const void* buf, size_t len) {
  auto p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    auto n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* buf, size_t len) {
  auto p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    auto n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// -- sender side --------------------------------------------------------------

struct batch_state {
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

using batch_ptr = std::shared_ptr<batch_state>;

struct slice {
  batch_ptr b;
  wire::frame_header hdr;
  const uint8_t* src = nullptr;
  size_t sent = 0; ///< Header + payload bytes already written.
};

struct out_conn {
  unique_fd fd;
  bool writable = false;
  std::deque<slice> queue;    ///< Not yet (fully) written.
  std::deque<slice> inflight; ///< Written, awaiting an ack (in order).
  std::array<uint8_t, sizeof(wire::ack)> ack_buf{};
  size_t ack_have = 0;
  uint64_t next_seq = 1;
  clock_type::time_point retry_after{};
};

struct peer_state {
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

// -- receiver side ------------------------------------------------------------

enum class in_state { auth, header, payload, discard };

struct in_conn {
  unique_fd fd;
  in_state st = in_state::auth;
  traffic_class tclass = traffic_class::control;
  std::string peer;
  std::array<uint8_t, 32> nonce{};
  std::array<uint8_t, sizeof(wire::hello)> buf{};
  size_t have = 0;
  wire::frame_header hdr{};
  region_table::pin pin;
  uint64_t done = 0;
  transport_errc verdict = transport_errc::none;
  std::vector<uint8_t> out; ///< Unsent acknowledgements.
  clock_type::time_point last_progress;
  bool dead = false;
};

class tcp_backend;

/// One receive thread: epoll over inbound connections (and the listener for
/// the control loop).
class rx_loop {
public:
  rx_loop(tcp_backend* owner, traffic_class tc) : owner_(owner), tc_(tc) {
    // nop
  }
  caf::error start(int listen_fd);
  void stop();
  /// Hands over an authenticated connection (from the control loop).
  void adopt(std::unique_ptr<in_conn> c);

private:
  void run();
  void add(std::unique_ptr<in_conn> c);
  void on_readable(in_conn& c);
  void drop(in_conn& c);
  bool flush(in_conn& c);
  void accept_all();
  void check_timeouts();
  bool handle_auth(in_conn& c);
  bool handle_header(in_conn& c);
  void finish_frame(in_conn& c);

  tcp_backend* owner_;
  traffic_class tc_;
  int listen_fd_ = -1;
  unique_fd ep_;
  unique_fd wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex adopt_mtx_;
  std::vector<std::unique_ptr<in_conn>> adopted_;
  std::unordered_map<int, std::unique_ptr<in_conn>> conns_;
  std::vector<int> doomed_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(64 * 1024);
};

class tcp_backend final : public backend {
public:
  explicit tcp_backend(const options& opts) : opts_(opts) {
    // nop
  }

  ~tcp_backend() override {
    stop_ = true;
    wake_sender();
    if (sender_.joinable())
      sender_.join();
    for (auto& l : rx_)
      if (l)
        l->stop();
    // Every batch still pending completes with an error (no op stays in
    // flight forever).
    std::vector<std::pair<completion_sink, completion>> done;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      for (auto& p : peers_)
        for (auto& c : p->conns)
          fail_conn(*p, c, transport_errc::peer_lost, "backend shut down");
      done.swap(done_);
    }
    for (auto& [sink, res] : done)
      if (sink)
        sink(std::move(res));
  }

  caf::error start() {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listen_)
      return sys_error("socket");
    int one = 1;
    ::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(opts_.listen_port);
    if (::inet_pton(AF_INET, opts_.listen_host.c_str(), &addr.sin_addr) != 1)
      return caf::make_error(transport_errc::bad_frame,
                             "transport.listen_host is not an IPv4 address: "
                                 + opts_.listen_host);
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
        != 0)
      return sys_error("bind");
    if (::listen(listen_.get(), 128) != 0)
      return sys_error("listen");
    socklen_t len = sizeof(addr);
    if (::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&addr), &len)
        != 0)
      return sys_error("getsockname");
    port_ = ntohs(addr.sin_port);
    set_nonblocking(listen_.get());
    sender_ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
    sender_wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!sender_ep_ || !sender_wake_)
      return sys_error("epoll_create1/eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (::epoll_ctl(sender_ep_.get(), EPOLL_CTL_ADD, sender_wake_.get(), &ev)
        != 0)
      return sys_error("epoll_ctl");
    // Every loop exists and runs before the accepting one (class 0) starts:
    // it hands a connection to its class's loop at once (two data races,
    // on rx_ and on a loop's epoll descriptor, found by the TSan build, when
    // a peer connected during start-up).
    for (size_t c = 0; c < traffic_class_count; ++c)
      rx_[c] = std::make_unique<rx_loop>(this, static_cast<traffic_class>(c));
    for (size_t c = traffic_class_count; c-- > 0;)
      if (auto err = rx_[c]->start(c == 0 ? listen_.get() : -1))
        return err;
    sender_ = std::thread{[this] { run_sender(); }};
    return caf::none;
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "tcp";
    c.immediate = true;
    c.cross_process = true;
    return c;
  }

  const std::string& node() const override {
    return opts_.node;
  }

  uint16_t port() const {
    return port_;
  }

  caf::expected<local_registration>
  register_region(void* ptr, uint64_t len, memory_kind kind, int) override {
    if (kind != memory_kind::host)
      return caf::make_error(transport_errc::unsupported,
                             "tcp backend registers host memory only");
    if (ptr == nullptr || len == 0)
      return caf::make_error(transport_errc::out_of_bounds, "empty region");
    auto desc = regions_.add(opts_.node, ptr, len);
    return local_registration{this, ptr, len, kind, std::move(desc)};
  }

  caf::expected<std::vector<uint8_t>> details_for(const std::string&) override {
    auto s = opts_.listen_host + ":" + std::to_string(port_);
    return std::vector<uint8_t>{s.begin(), s.end()};
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override {
    std::string s{details.begin(), details.end()};
    auto colon = s.rfind(':');
    if (colon == std::string::npos)
      return caf::make_error(transport_errc::bad_frame,
                             "tcp details must be host:port, got " + s);
    auto port = std::strtoul(s.c_str() + colon + 1, nullptr, 10);
    if (port == 0 || port > 65535)
      return caf::make_error(transport_errc::bad_frame, "bad port in " + s);
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = peer_index_.find(peer);
    if (i == peer_index_.end()) {
      peers_.push_back(
          std::make_unique<peer_state>(opts_.weight_control, opts_.weight_kv));
      i = peer_index_.emplace(peer, peers_.size() - 1).first;
    }
    auto& p = *peers_[i->second];
    p.name = peer;
    p.host = s.substr(0, colon);
    p.port = static_cast<uint16_t>(port);
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    post_defaults(b, opts_);
    auto fail_now = [&](caf::error err) {
      {
        std::lock_guard<std::mutex> guard{stats_mtx_};
        ++stats_.batches_posted;
        ++stats_.batches_failed;
      }
      if (sink)
        sink(completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                        std::move(err)});
    };
    if (auto err = validate(b))
      return fail_now(std::move(err));
    // Frames never exceed the receiver's bound: large writes are sliced.
    const auto slice_len = std::max<uint64_t>(
        std::min(opts_.slice_kib << 10, opts_.max_frame_mib << 20), 1);
    std::unique_lock<std::mutex> guard{mtx_};
    auto i = peer_index_.find(b.writes.front().destination.node);
    if (i == peer_index_.end()) {
      guard.unlock();
      return fail_now(
          caf::make_error(transport_errc::peer_lost,
                          "unknown peer " + b.writes.front().destination.node));
    }
    auto& p = *peers_[i->second];
    if (p.pending >= opts_.max_pending_batches) {
      guard.unlock();
      return fail_now(caf::make_error(transport_errc::queue_full,
                                      "too many pending batches to " + p.name));
    }
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
      auto src =
          static_cast<const uint8_t*>(w.source->data()) + w.source_offset;
      uint64_t off = 0;
      do {
        auto n = std::min(slice_len, w.destination.length - off);
        slice s;
        s.b = st;
        s.src = src + off;
        s.hdr = wire::make_header(w.destination.region_id, w.destination.key,
                                  w.destination.offset + off, n, b.tclass);
        bool last =
            wi + 1 == b.writes.size() && off + n == w.destination.length;
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
    {
      std::lock_guard<std::mutex> g2{stats_mtx_};
      ++stats_.batches_posted;
    }
    wake_sender();
  }

  void on_immediate(immediate_handler f) override {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    handler_ = std::move(f);
  }

  counters stats() const override {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    return stats_;
  }

  void drop_peer(const std::string& peer) override {
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = peer_index_.find(peer);
    if (i == peer_index_.end())
      return;
    auto& p = *peers_[i->second];
    for (auto& c : p.conns)
      fail_conn(p, c, transport_errc::peer_lost, "peer dropped");
  }

  // -- used by the receive loops ----------------------------------------------

  const options& opts() const {
    return opts_;
  }
  region_table& regions() {
    return regions_;
  }
  void count(uint64_t counters::*field, uint64_t n = 1) {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    stats_.*field += n;
  }
  void signal_immediate(incoming_immediate x) {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    if (handler_)
      handler_(x);
  }
  rx_loop& rx(traffic_class tc) {
    return *rx_[static_cast<size_t>(tc)];
  }

protected:
  void deregister(uint32_t region_id) override {
    regions_.remove(region_id);
  }

private:
  void wake_sender() {
    uint64_t one = 1;
    auto rc = ::write(sender_wake_.get(), &one, sizeof(one));
    static_cast<void>(rc);
  }

  /// Completes `b` (once). Called with mtx_ held; the sink runs after unlock
  /// through `done_`.
  void finish(batch_state& b, caf::error err) {
    if (b.done)
      return;
    b.done = true;
    --peers_[b.peer]->pending;
    completion res{b.tag, b.acked_bytes, err ? b.ops : 0, std::move(err)};
    {
      std::lock_guard<std::mutex> guard{stats_mtx_};
      if (res.error) {
        ++stats_.batches_failed;
        auto code = static_cast<transport_errc>(res.error.code());
        if (code == transport_errc::deadline_exceeded)
          ++stats_.deadline_exceeded;
        else if (code == transport_errc::peer_lost)
          ++stats_.peer_lost;
      } else {
        ++stats_.batches_completed;
      }
    }
    done_.emplace_back(std::move(b.sink), std::move(res));
  }

  /// Closes a connection and fails every batch with a slice on it.
  void fail_conn(peer_state&, out_conn& c, transport_errc code,
                 const std::string& why) {
    if (c.fd && sender_ep_)
      ::epoll_ctl(sender_ep_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
    c.fd.reset();
    c.writable = false;
    c.ack_have = 0;
    for (auto* q : {&c.inflight, &c.queue})
      for (auto& s : *q)
        finish(*s.b, caf::make_error(code, why));
    c.inflight.clear();
    c.queue.clear();
  }

  /// Connects and authenticates (blocking, bounded by io_timeout); runs on
  /// the sender thread without mtx_.
  caf::expected<unique_fd> dial(const std::string& host, uint16_t port,
                                traffic_class tc) {
    count(&counters::connects);
    unique_fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    if (!fd)
      return sys_error("socket");
    timeval tv{};
    auto ms = opts_.io_timeout.count();
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    set_nodelay(fd.get());
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
      return caf::make_error(transport_errc::peer_lost, "bad host " + host);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
        != 0)
      return caf::make_error(transport_errc::peer_lost,
                             "connect to " + host + ":" + std::to_string(port)
                                 + ": " + std::strerror(errno));
    wire::challenge ch{};
    if (!read_all(fd.get(), &ch, sizeof(ch)) || ch.magic != wire::auth_magic)
      return caf::make_error(transport_errc::peer_lost,
                             "no challenge from " + host);
    wire::hello h{};
    h.magic = wire::auth_magic;
    h.version = wire::version;
    h.tclass = static_cast<uint8_t>(tc);
    auto name = opts_.node.substr(0, sizeof(h.node) - 1);
    std::memcpy(h.node, name.data(), name.size());
    for (auto& x : h.nonce)
      x = static_cast<uint8_t>(random_u64());
    wire::client_mac(opts_.secret, ch.nonce, h);
    if (!write_all(fd.get(), &h, sizeof(h)))
      return caf::make_error(transport_errc::peer_lost, "hello not sent");
    wire::welcome w{};
    if (!read_all(fd.get(), &w, sizeof(w)) || w.magic != wire::auth_magic)
      return caf::make_error(transport_errc::unauthenticated,
                             "peer " + host + " refused our credentials");
    if (w.status != 0)
      return caf::make_error(transport_errc::unauthenticated,
                             "peer " + host + " refused our credentials");
    if (!wire::server_mac_ok(opts_.secret, h.nonce, w))
      return caf::make_error(transport_errc::unauthenticated,
                             "peer " + host + " failed to prove the secret");
    tv = timeval{};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    set_nonblocking(fd.get());
    return fd;
  }

  void connect_needed(std::unique_lock<std::mutex>& guard) {
    auto now = clock_type::now();
    for (size_t pi = 0; pi < peers_.size(); ++pi) {
      for (size_t c = 0; c < traffic_class_count; ++c) {
        auto& p = *peers_[pi];
        auto& conn = p.conns[c];
        if (conn.fd || conn.queue.empty() || now < conn.retry_after)
          continue;
        auto host = p.host;
        auto port = p.port;
        guard.unlock();
        auto fd = dial(host, port, static_cast<traffic_class>(c));
        guard.lock();
        auto& p2 = *peers_[pi];
        auto& conn2 = p2.conns[c];
        if (!fd) {
          auto code = static_cast<transport_errc>(fd.error().code());
          auto why = fd.error().context().empty()
                         ? std::string{"connect failed"}
                         : fd.error().context().get_as<std::string>(0);
          fail_conn(p2, conn2, code, why);
          continue;
        }
        conn2.fd = std::move(*fd);
        conn2.writable = true;
        conn2.ack_have = 0;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
        ev.data.u64 = (uint64_t{pi} << 8) | c | (uint64_t{1} << 63);
        ::epoll_ctl(sender_ep_.get(), EPOLL_CTL_ADD, conn2.fd.get(), &ev);
      }
    }
  }

  /// Reads acknowledgements until EAGAIN.
  void read_acks(peer_state& p, out_conn& c) {
    for (;;) {
      if (!c.fd)
        return;
      auto n = ::recv(c.fd.get(), c.ack_buf.data() + c.ack_have,
                      c.ack_buf.size() - c.ack_have, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        fail_conn(p, c, transport_errc::peer_lost,
                  "connection to " + p.name + " lost");
        return;
      }
      c.ack_have += static_cast<size_t>(n);
      if (c.ack_have < c.ack_buf.size())
        continue;
      c.ack_have = 0;
      wire::ack a;
      std::memcpy(&a, c.ack_buf.data(), sizeof(a));
      if (a.magic != wire::ack_magic || c.inflight.empty()
          || a.seq != c.inflight.front().hdr.seq) {
        fail_conn(p, c, transport_errc::bad_frame,
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

  /// Writes up to `quantum` bytes of the front slice; returns bytes written.
  size_t write_some(peer_state& p, out_conn& c, size_t quantum) {
    auto& s = c.queue.front();
    const size_t hdr_len = sizeof(wire::frame_header);
    const size_t total = hdr_len + s.hdr.length;
    iovec iov[2];
    int cnt = 0;
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
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(cnt);
    auto n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        c.writable = errno == EINTR;
        return 0;
      }
      fail_conn(p, c, transport_errc::peer_lost,
                "send to " + p.name + ": " + std::strerror(errno));
      return 0;
    }
    s.sent += static_cast<size_t>(n);
    if (s.sent == total) {
      c.inflight.push_back(std::move(s));
      c.queue.pop_front();
    }
    return static_cast<size_t>(n);
  }

  /// Sends for one pass; true when data could still be sent (the pass ended
  /// on its budget, so the loop must come back without waiting). The pass is
  /// short because post() waits for mtx_ while it runs: a control batch
  /// posted meanwhile waits at most about one pass.
  bool pump(peer_state& p) {
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
      std::lock_guard<std::mutex> guard{stats_mtx_};
      stats_.bytes_sent[c] += n;
      if (eligible[0] && eligible[1])
        stats_.contended_bytes[c] += n;
    }
    return true;
  }

  void check_deadlines() {
    auto now = clock_type::now();
    for (auto i = batches_.begin(); i != batches_.end();) {
      auto& b = **i;
      if (!b.done && now >= b.deadline) {
        finish(b, caf::make_error(transport_errc::deadline_exceeded,
                                  "batch " + std::to_string(b.tag)
                                      + " missed its deadline"));
        // A partly written slice of this batch reads memory the caller may
        // now free: close that connection (it reconnects on next use).
        auto& p = *peers_[b.peer];
        auto& c = p.conns[static_cast<size_t>(b.tclass)];
        if (!c.queue.empty() && c.queue.front().b.get() == &b
            && c.queue.front().sent > 0)
          fail_conn(p, c, transport_errc::peer_lost,
                    "connection closed after a deadline mid-frame");
      }
      if (b.done)
        i = batches_.erase(i);
      else
        ++i;
    }
  }

  void run_sender() {
    std::array<epoll_event, 64> events;
    bool more = false;
    while (!stop_) {
      int n = ::epoll_wait(sender_ep_.get(), events.data(),
                           static_cast<int>(events.size()), more ? 0 : 5);
      std::unique_lock<std::mutex> guard{mtx_};
      for (int i = 0; i < n; ++i) {
        auto tag = events[i].data.u64;
        if (tag == 0) {
          uint64_t x;
          auto rc = ::read(sender_wake_.get(), &x, sizeof(x));
          static_cast<void>(rc);
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

  options opts_;
  region_table regions_;
  unique_fd listen_;
  uint16_t port_ = 0;
  std::array<std::unique_ptr<rx_loop>, traffic_class_count> rx_;

  std::mutex mtx_; // guards peers_, batches_, done_
  std::vector<std::unique_ptr<peer_state>> peers_;
  std::unordered_map<std::string, size_t> peer_index_;
  std::list<batch_ptr> batches_;
  std::vector<std::pair<completion_sink, completion>> done_;

  std::mutex handler_mtx_;
  immediate_handler handler_;
  mutable std::mutex stats_mtx_;
  counters stats_;

  unique_fd sender_ep_;
  unique_fd sender_wake_;
  std::atomic<bool> stop_{false};
  std::thread sender_;
};

// -- rx_loop ------------------------------------------------------------------

caf::error rx_loop::start(int listen_fd) {
  listen_fd_ = listen_fd;
  ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ep_ || !wake_)
    return sys_error("epoll_create1/eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_.get();
  ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  if (listen_fd_ >= 0) {
    ev.data.fd = listen_fd_;
    ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, listen_fd_, &ev);
  }
  thread_ = std::thread{[this] { run(); }};
  return caf::none;
}

void rx_loop::stop() {
  stop_ = true;
  uint64_t one = 1;
  auto rc = ::write(wake_.get(), &one, sizeof(one));
  static_cast<void>(rc);
  if (thread_.joinable())
    thread_.join();
  conns_.clear();
}

void rx_loop::adopt(std::unique_ptr<in_conn> c) {
  {
    std::lock_guard<std::mutex> guard{adopt_mtx_};
    adopted_.push_back(std::move(c));
  }
  uint64_t one = 1;
  auto rc = ::write(wake_.get(), &one, sizeof(one));
  static_cast<void>(rc);
}

void rx_loop::add(std::unique_ptr<in_conn> c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = c->fd.get();
  ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev);
  auto fd = c->fd.get();
  conns_[fd] = std::move(c);
}

void rx_loop::run() {
  if (tc_ == traffic_class::kv) {
    // Bulk receive work yields the CPU to control traffic (the host analogue
    // of a low-priority virtual lane).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)),
                  owner_->opts().kv_rx_nice);
  }
  std::array<epoll_event, 64> events;
  while (!stop_) {
    int n = ::epoll_wait(ep_.get(), events.data(),
                         static_cast<int>(events.size()), 20);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        uint64_t x;
        auto rc = ::read(wake_.get(), &x, sizeof(x));
        static_cast<void>(rc);
        std::vector<std::unique_ptr<in_conn>> got;
        {
          std::lock_guard<std::mutex> guard{adopt_mtx_};
          got.swap(adopted_);
        }
        for (auto& c : got)
          add(std::move(c));
      } else if (fd == listen_fd_) {
        accept_all();
      } else {
        auto it = conns_.find(fd);
        if (it == conns_.end() || it->second->dead)
          continue;
        if (events[i].events & EPOLLOUT)
          flush(*it->second);
        if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
          on_readable(*it->second);
      }
    }
    check_timeouts();
    for (auto fd : doomed_) {
      ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr);
      conns_.erase(fd);
    }
    doomed_.clear();
  }
}

void rx_loop::accept_all() {
  for (;;) {
    int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return;
    owner_->count(&counters::connections_accepted);
    set_nodelay(fd);
    auto c = std::make_unique<in_conn>();
    c->fd.reset(fd);
    c->last_progress = clock_type::now();
    wire::challenge ch{};
    ch.magic = wire::auth_magic;
    ch.version = wire::version;
    for (auto& x : ch.nonce)
      x = static_cast<uint8_t>(random_u64());
    std::memcpy(c->nonce.data(), ch.nonce, sizeof(ch.nonce));
    c->out.assign(reinterpret_cast<uint8_t*>(&ch),
                  reinterpret_cast<uint8_t*>(&ch) + sizeof(ch));
    auto* raw = c.get();
    add(std::move(c));
    flush(*raw);
  }
}

void rx_loop::drop(in_conn& c) {
  if (c.dead)
    return;
  c.dead = true;
  c.pin.reset();
  doomed_.push_back(c.fd.get());
}

bool rx_loop::flush(in_conn& c) {
  while (!c.out.empty()) {
    auto n = ::send(c.fd.get(), c.out.data(), c.out.size(),
                    MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT;
      ev.data.fd = c.fd.get();
      ::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
      return true;
    }
    if (n <= 0) {
      drop(c);
      return false;
    }
    c.out.erase(c.out.begin(), c.out.begin() + n);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = c.fd.get();
  ::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  return true;
}

void rx_loop::check_timeouts() {
  auto now = clock_type::now();
  for (auto& [fd, c] : conns_) {
    if (c->dead)
      continue;
    bool idle_ok = c->st == in_state::header && c->have == 0;
    if (!idle_ok && now - c->last_progress > owner_->opts().io_timeout) {
      owner_->count(&counters::dropped_half_open);
      drop(*c);
    }
  }
}

bool rx_loop::handle_auth(in_conn& c) {
  auto parsed = wire::parse_hello(c.buf.data(), c.buf.size(),
                                  owner_->opts().secret, c.nonce);
  wire::welcome w{};
  w.magic = wire::auth_magic;
  if (!parsed) {
    owner_->count(&counters::rejected_unauthenticated);
    w.status = static_cast<uint8_t>(transport_errc::unauthenticated);
    auto rc = ::send(c.fd.get(), &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT);
    static_cast<void>(rc);
    drop(c);
    return false;
  }
  auto& h = *parsed;
  wire::server_mac(owner_->opts().secret, h.nonce, w);
  c.peer = h.node;
  c.tclass = static_cast<traffic_class>(h.tclass);
  c.st = in_state::header;
  c.have = 0;
  c.out.insert(c.out.end(), reinterpret_cast<uint8_t*>(&w),
               reinterpret_cast<uint8_t*>(&w) + sizeof(w));
  if (!flush(c))
    return false;
  if (c.tclass != tc_) {
    // Hand the connection to its class's loop.
    auto it = conns_.find(c.fd.get());
    ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
    auto owned = std::move(it->second);
    conns_.erase(it);
    owner_->rx(owned->tclass).adopt(std::move(owned));
    return false;
  }
  return true;
}

bool rx_loop::handle_header(in_conn& c) {
  auto parsed = wire::parse_frame_header(c.buf.data(), c.buf.size(),
                                         owner_->opts().max_frame_mib << 20);
  if (!parsed) {
    // The stream can no longer be trusted to be framed: drop it.
    owner_->count(&counters::rejected_bad_frame);
    drop(c);
    return false;
  }
  c.hdr = *parsed;
  auto& h = c.hdr;
  c.done = 0;
  c.verdict =
      owner_->regions().acquire(h.region_id, h.key, h.offset, h.length, c.pin);
  switch (c.verdict) {
    case transport_errc::none:
      break;
    case transport_errc::unknown_region:
      owner_->count(&counters::rejected_unknown_region);
      break;
    case transport_errc::wrong_key:
      owner_->count(&counters::rejected_wrong_key);
      break;
    default:
      owner_->count(&counters::rejected_out_of_bounds);
      break;
  }
  c.st =
      c.verdict == transport_errc::none ? in_state::payload : in_state::discard;
  if (h.length == 0)
    finish_frame(c);
  return true;
}

void rx_loop::finish_frame(in_conn& c) {
  bool ok = c.verdict == transport_errc::none;
  auto region = c.hdr.region_id;
  c.pin.reset();
  if (ok) {
    owner_->count(&counters::bytes_received, c.hdr.length);
    if (c.hdr.flags & wire::flag_immediate)
      owner_->signal_immediate(
          incoming_immediate{c.peer, region, c.hdr.immediate});
  }
  wire::ack a{};
  a.magic = wire::ack_magic;
  a.status = static_cast<uint8_t>(c.verdict);
  a.seq = c.hdr.seq;
  c.out.insert(c.out.end(), reinterpret_cast<uint8_t*>(&a),
               reinterpret_cast<uint8_t*>(&a) + sizeof(a));
  c.st = in_state::header;
  c.have = 0;
  // Acknowledgements are flushed together when the read loop pauses.
}

void rx_loop::on_readable(in_conn& c) {
  // Bounded work per wake-up so one busy peer cannot starve the others
  // (epoll is level-triggered, so the rest is read on the next round).
  size_t budget = 4 * 1024 * 1024;
  while (budget > 0) {
    ssize_t n = 0;
    if (c.st == in_state::auth || c.st == in_state::header) {
      size_t want = c.st == in_state::auth ? sizeof(wire::hello)
                                           : sizeof(wire::frame_header);
      n = ::recv(c.fd.get(), c.buf.data() + c.have, want - c.have, 0);
      if (n > 0) {
        c.have += static_cast<size_t>(n);
        c.last_progress = clock_type::now();
        if (c.have == want) {
          bool go = c.st == in_state::auth ? handle_auth(c) : handle_header(c);
          if (!go)
            return;
        }
      }
    } else {
      auto left = c.hdr.length - c.done;
      auto chunk = std::min<uint64_t>(left, budget);
      if (c.st == in_state::payload) {
        // Straight into the registered region.
        n = ::recv(c.fd.get(), c.pin.ptr() + c.done, chunk, 0);
      } else {
        n = ::recv(c.fd.get(), scratch_.data(),
                   std::min<uint64_t>(chunk, scratch_.size()), 0);
      }
      if (n > 0) {
        c.done += static_cast<uint64_t>(n);
        budget -= std::min(budget, static_cast<size_t>(n));
        c.last_progress = clock_type::now();
        if (c.done == c.hdr.length)
          finish_frame(c);
      }
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n <= 0) {
      drop(c);
      return;
    }
  }
  if (!c.dead && !c.out.empty())
    flush(c);
}

} // namespace

caf::expected<std::unique_ptr<backend>> make_tcp_backend(const options& opts) {
  if (opts.secret.empty())
    return caf::make_error(transport_errc::unauthenticated,
                           "transport.secret must be set for the tcp backend");
  auto ptr = std::make_unique<tcp_backend>(opts);
  if (auto err = ptr->start())
    return err;
  return std::unique_ptr<backend>{std::move(ptr)};
}

} // namespace dualpath::transport::bulk
