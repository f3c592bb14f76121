// ctest-label: transport
// The tcp bulk backend over real loopback sockets: byte-exact writes, batches,
// completion semantics, every bad-input case (checked against the receiver's
// counters and canary bytes around the region), authentication, half-open
// connections, deadlines, a receiver process killed mid-batch, reconnection
// and weighted round robin under contention.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/tcp_wire.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

constexpr uint8_t canary = 0xA5;
constexpr size_t guard = 4096;

options opts_for(const std::string& node,
                 const std::string& secret = "s3cr3t") {
  options o;
  o.backend = "tcp";
  o.node = node;
  o.secret = secret;
  o.io_timeout = 300ms;
  return o;
}

std::unique_ptr<backend> make(const options& o) {
  auto b = make_tcp_backend(o);
  REQUIRE(b);
  return std::move(*b);
}

/// A receive buffer with canary bytes on both sides of the registered window.
struct guarded_buffer {
  std::vector<uint8_t> bytes;
  explicit guarded_buffer(size_t len) : bytes(len + 2 * guard, canary) {
  }
  uint8_t* window() {
    return bytes.data() + guard;
  }
  size_t size() const {
    return bytes.size() - 2 * guard;
  }
  bool guards_intact() const {
    for (size_t i = 0; i < guard; ++i)
      if (bytes[i] != canary || bytes[bytes.size() - 1 - i] != canary)
        return false;
    return true;
  }
};

/// Waits for one completion.
struct waiter {
  std::promise<completion> p;
  std::future<completion> f = p.get_future();
  completion_sink sink() {
    return [this](completion c) { p.set_value(std::move(c)); };
  }
  completion get(std::chrono::milliseconds limit = 10s) {
    REQUIRE(f.wait_for(limit) == std::future_status::ready);
    return f.get();
  }
};

void link(backend& from, backend& to) {
  auto d = to.details_for(from.node());
  REQUIRE(d);
  REQUIRE(!from.connect(to.node(), *d));
}

transport_errc code_of(const caf::error& e) {
  return static_cast<transport_errc>(e.code());
}

batch one_write(const local_registration& src, uint64_t src_off,
                remote_region dst, traffic_class tc = traffic_class::kv) {
  batch b;
  b.tclass = tc;
  b.writes.push_back(write_request{&src, src_off, std::move(dst)});
  return b;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng{seed};
  for (auto& x : v)
    x = static_cast<uint8_t>(rng());
  return v;
}

struct pair_fixture {
  std::unique_ptr<backend> a = make(opts_for("a"));
  std::unique_ptr<backend> b = make(opts_for("b"));
  pair_fixture() {
    link(*a, *b);
  }
};

int connect_raw(const backend& target) {
  auto d = const_cast<backend&>(target).details_for("raw");
  std::string s{d->begin(), d->end()};
  auto port = std::stoi(s.substr(s.rfind(':') + 1));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/// Performs the client side of the handshake on a raw socket.
bool raw_auth(int fd, const std::string& secret) {
  wire::challenge ch{};
  if (::recv(fd, &ch, sizeof(ch), MSG_WAITALL) != sizeof(ch))
    return false;
  wire::hello h{};
  h.magic = wire::auth_magic;
  h.version = wire::version;
  h.tclass = 0;
  std::strcpy(h.node, "raw");
  wire::client_mac(secret, ch.nonce, h);
  if (::send(fd, &h, sizeof(h), 0) != sizeof(h))
    return false;
  wire::welcome w{};
  return ::recv(fd, &w, sizeof(w), MSG_WAITALL) == sizeof(w) && w.status == 0;
}

/// True when the peer closed `fd` (recv returns 0 or an error) within 2 s.
bool closed_by_peer(int fd) {
  char buf[256];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      return true;
  }
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 3s) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred())
      return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

} // namespace

TEST_CASE("tcp writes are byte-exact at many sizes and offsets") {
  pair_fixture f;
  const size_t region_len = 6 << 20;
  guarded_buffer dst{region_len};
  auto src_bytes = pattern(region_len, 1);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.window(), dst.size());
  REQUIRE(src);
  REQUIRE(reg);
  std::mt19937 rng{7};
  size_t total = 0;
  for (size_t len : {size_t{1}, size_t{7}, size_t{4096}, size_t{65537},
                     size_t{1 << 20}, size_t{(1 << 20) + 3}, size_t{5 << 20}}) {
    for (int rep = 0; rep < 3; ++rep) {
      auto src_off = rng() % (region_len - len + 1);
      auto dst_off = rng() % (region_len - len + 1);
      auto view = reg->describe().subrange(dst_off, len);
      REQUIRE(view);
      waiter w;
      f.a->post(one_write(*src, src_off, *view), w.sink());
      auto c = w.get();
      CHECK_MESSAGE(!c.error, to_string(c.error));
      CHECK(c.bytes == len);
      CHECK(c.failed_ops == 0);
      CHECK(std::memcmp(dst.window() + dst_off, src_bytes.data() + src_off, len)
            == 0);
      total += len;
    }
  }
  CHECK(dst.guards_intact());
  CHECK(f.b->stats().bytes_received == total);
  CHECK(f.a->stats().batches_completed == 21);
}

TEST_CASE("a batch completes once with the sum of its writes and its "
          "immediate") {
  pair_fixture f;
  std::vector<uint8_t> dst(1 << 20, 0);
  auto src_bytes = pattern(1 << 20, 2);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.data(), dst.size());
  std::promise<incoming_immediate> imm;
  f.b->on_immediate([&](const incoming_immediate& x) { imm.set_value(x); });
  batch b;
  b.tag = 42;
  b.immediate = 0xBEEF;
  for (uint64_t i = 0; i < 16; ++i)
    b.writes.push_back(write_request{
        &*src, i * 4096, *reg->describe().subrange((15 - i) * 4096, 4096)});
  waiter w;
  f.a->post(std::move(b), w.sink());
  auto c = w.get();
  CHECK(!c.error);
  CHECK(c.tag == 42);
  CHECK(c.bytes == 16 * 4096);
  for (uint64_t i = 0; i < 16; ++i)
    CHECK(std::memcmp(dst.data() + (15 - i) * 4096, src_bytes.data() + i * 4096,
                      4096)
          == 0);
  auto fut = imm.get_future();
  REQUIRE(fut.wait_for(2s) == std::future_status::ready);
  auto x = fut.get();
  CHECK(x.value == 0xBEEF);
  CHECK(x.from_node == "a");
  CHECK(x.region_id == reg->id());
}

TEST_CASE("bad destinations are rejected with typed errors and counters, "
          "and the connection keeps serving") {
  pair_fixture f;
  guarded_buffer dst{64 * 1024};
  auto src_bytes = pattern(256 * 1024, 3);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.window(), dst.size());
  auto good = reg->describe();

  auto expect = [&](remote_region bad, transport_errc code) {
    waiter w;
    f.a->post(one_write(*src, 0, bad), w.sink());
    auto c = w.get();
    CHECK(code_of(c.error) == code);
    CHECK(c.failed_ops == 1);
  };
  auto unknown = good;
  unknown.region_id += 100;
  unknown.length = 100;
  expect(unknown, transport_errc::unknown_region);
  auto wrong_key = good;
  wrong_key.key ^= 1;
  wrong_key.length = 100;
  expect(wrong_key, transport_errc::wrong_key);
  auto past_end = good;
  past_end.offset = 60 * 1024;
  past_end.length = 8 * 1024; // runs 4 KiB past the region
  expect(past_end, transport_errc::out_of_bounds);
  auto huge_off = good;
  huge_off.offset = ~uint64_t{0} - 10;
  huge_off.length = 100; // overflows if added naively
  expect(huge_off, transport_errc::out_of_bounds);

  auto s = f.b->stats();
  CHECK(s.rejected_unknown_region == 1);
  CHECK(s.rejected_wrong_key == 1);
  CHECK(s.rejected_out_of_bounds == 2);
  CHECK(s.bytes_received == 0);
  CHECK(dst.guards_intact());
  CHECK(std::all_of(dst.window(), dst.window() + dst.size(),
                    [](uint8_t x) { return x == canary; }));

  // The same connection still carries good writes.
  waiter w;
  f.a->post(one_write(*src, 0, *good.subrange(0, 64 * 1024)), w.sink());
  CHECK(!w.get().error);
  CHECK(std::memcmp(dst.window(), src_bytes.data(), 64 * 1024) == 0);
  CHECK(dst.guards_intact());
}

TEST_CASE("a source range outside the local registration fails at post") {
  pair_fixture f;
  std::vector<uint8_t> src_bytes(1000), dst(1000);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.data(), dst.size());
  waiter w;
  f.a->post(one_write(*src, 900, *reg->describe().subrange(0, 200)), w.sink());
  CHECK(code_of(w.get().error) == transport_errc::out_of_bounds);
}

TEST_CASE("garbage, oversized frames and failed authentication from raw "
          "sockets drop that connection only") {
  auto o = opts_for("b");
  o.max_frame_mib = 1;
  auto b = make(o);
  auto a = make(opts_for("a"));
  link(*a, *b);
  guarded_buffer dst{1 << 20};
  auto reg = b->register_region(dst.window(), dst.size());
  auto src_bytes = pattern(1 << 20, 4);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());

  SUBCASE("garbage instead of a hello") {
    int fd = connect_raw(*b);
    wire::challenge ch{};
    REQUIRE(::recv(fd, &ch, sizeof(ch), MSG_WAITALL) == sizeof(ch));
    std::vector<uint8_t> junk(sizeof(wire::hello), 0x42);
    REQUIRE(::send(fd, junk.data(), junk.size(), 0) == (ssize_t)junk.size());
    CHECK(closed_by_peer(fd));
    ::close(fd);
    CHECK(eventually([&] { return b->stats().rejected_unauthenticated == 1; }));
  }
  SUBCASE("hello with the wrong secret") {
    int fd = connect_raw(*b);
    CHECK(!raw_auth(fd, "not-the-secret"));
    CHECK(closed_by_peer(fd));
    ::close(fd);
    CHECK(eventually([&] { return b->stats().rejected_unauthenticated == 1; }));
  }
  SUBCASE("garbage frame header after a valid handshake") {
    int fd = connect_raw(*b);
    REQUIRE(raw_auth(fd, "s3cr3t"));
    std::vector<uint8_t> junk(sizeof(wire::frame_header), 0x17);
    REQUIRE(::send(fd, junk.data(), junk.size(), 0) == (ssize_t)junk.size());
    CHECK(closed_by_peer(fd));
    ::close(fd);
    CHECK(eventually([&] { return b->stats().rejected_bad_frame == 1; }));
  }
  SUBCASE("oversized frame with a valid key") {
    int fd = connect_raw(*b);
    REQUIRE(raw_auth(fd, "s3cr3t"));
    auto d = reg->describe();
    auto h = wire::make_header(d.region_id, d.key, 0, (1 << 20) + 1,
                               traffic_class::control);
    REQUIRE(::send(fd, &h, sizeof(h), 0) == sizeof(h));
    std::vector<uint8_t> payload(64 * 1024, 0x99);
    // The receiver drops the connection before reading any payload.
    ::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL);
    CHECK(closed_by_peer(fd));
    ::close(fd);
    CHECK(eventually([&] { return b->stats().rejected_bad_frame == 1; }));
    CHECK(b->stats().bytes_received == 0);
  }
  CHECK(std::all_of(dst.window(), dst.window() + dst.size(),
                    [](uint8_t x) { return x == canary; }));
  CHECK(dst.guards_intact());
  // The legitimate peer is still served.
  waiter w;
  a->post(one_write(*src, 0, reg->describe()), w.sink());
  auto c = w.get();
  CHECK(!c.error);
  CHECK(std::memcmp(dst.window(), src_bytes.data(), dst.size()) == 0);
}

TEST_CASE("a peer with the wrong secret is refused: its batch fails "
          "unauthenticated") {
  auto b = make(opts_for("b", "right"));
  auto a = make(opts_for("a", "wrong"));
  link(*a, *b);
  std::vector<uint8_t> src_bytes(4096, 1), dst(4096, 0);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = b->register_region(dst.data(), dst.size());
  waiter w;
  a->post(one_write(*src, 0, reg->describe()), w.sink());
  auto c = w.get();
  CHECK(code_of(c.error) == transport_errc::unauthenticated);
  CHECK(c.failed_ops == 1);
  CHECK(eventually([&] { return b->stats().rejected_unauthenticated == 1; }));
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0; }));
}

TEST_CASE("half-open connections are dropped after the io timeout") {
  auto b = make(opts_for("b"));
  SUBCASE("silent before the handshake") {
    int fd = connect_raw(*b);
    CHECK(eventually([&] { return b->stats().dropped_half_open == 1; }));
    CHECK(closed_by_peer(fd));
    ::close(fd);
  }
  SUBCASE("stalled in the middle of a frame") {
    std::vector<uint8_t> dst(8192, 0);
    auto reg = b->register_region(dst.data(), dst.size());
    int fd = connect_raw(*b);
    REQUIRE(raw_auth(fd, "s3cr3t"));
    auto d = reg->describe();
    auto h =
        wire::make_header(d.region_id, d.key, 0, 8192, traffic_class::control);
    REQUIRE(::send(fd, &h, sizeof(h), 0) == sizeof(h));
    std::vector<uint8_t> part(100, 7);
    REQUIRE(::send(fd, part.data(), part.size(), 0) == 100);
    CHECK(eventually([&] { return b->stats().dropped_half_open == 1; }));
    CHECK(closed_by_peer(fd));
    ::close(fd);
    // What landed stayed inside the region: only its first 100 bytes.
    CHECK(std::all_of(dst.begin() + 100, dst.end(),
                      [](uint8_t x) { return x == 0; }));
  }
}

namespace {

/// A receiver in a child process: registers `len` bytes and reports its
/// address and descriptor through a pipe, then serves until killed.
struct child_receiver {
  pid_t pid = -1;
  std::string address;
  remote_region region;

  explicit child_receiver(uint64_t len) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      auto be = make_tcp_backend(opts_for("child"));
      if (!be)
        _exit(1);
      std::vector<uint8_t> buf(len);
      auto reg = (*be)->register_region(buf.data(), buf.size());
      auto d = (*be)->details_for("a");
      std::string msg{d->begin(), d->end()};
      msg += " " + std::to_string(reg->describe().region_id) + " "
             + std::to_string(reg->describe().key) + "\n";
      if (::write(fds[1], msg.data(), msg.size()) < 0)
        _exit(1);
      for (;;)
        ::pause();
    }
    ::close(fds[1]);
    std::string line;
    char ch;
    while (::read(fds[0], &ch, 1) == 1 && ch != '\n')
      line += ch;
    ::close(fds[0]);
    std::istringstream in{line};
    in >> address >> region.region_id >> region.key;
    region.node = "child";
    region.length = len;
    REQUIRE(!address.empty());
  }

  void kill(int sig) {
    ::kill(pid, sig);
  }

  ~child_receiver() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

} // namespace

TEST_CASE("a receiver killed mid-batch fails every pending batch within its "
          "deadline") {
  const uint64_t len = 64 << 20;
  child_receiver child{len};
  auto a = make(opts_for("a"));
  REQUIRE(!a->connect("child", {child.address.begin(), child.address.end()}));
  std::vector<uint8_t> src_bytes(len, 3);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  // Warm up: the connection is established and a write succeeds.
  {
    waiter w;
    a->post(one_write(*src, 0, *child.region.subrange(0, 4096)), w.sink());
    REQUIRE(!w.get().error);
  }
  // Many large batches; kill the receiver while they are in flight.
  constexpr int n = 16;
  std::vector<waiter> ws(n);
  auto start = clock_type::now();
  auto deadline = start + 4s;
  for (int i = 0; i < n; ++i) {
    batch b = one_write(*src, 0, child.region);
    b.tag = static_cast<uint64_t>(i);
    b.deadline = deadline;
    a->post(std::move(b), ws[i].sink());
  }
  std::this_thread::sleep_for(20ms);
  child.kill(SIGKILL);
  int failed = 0;
  for (auto& w : ws) {
    auto c = w.get(6s);
    if (c.error) {
      ++failed;
      CHECK(c.failed_ops == 1);
      auto code = code_of(c.error);
      CHECK((code == transport_errc::peer_lost
             || code == transport_errc::deadline_exceeded));
    }
  }
  CHECK(clock_type::now() <= deadline + 200ms);
  // 16 x 64 MiB cannot all land in 20 ms.
  CHECK(failed >= n / 2);
  CHECK(a->stats().peer_lost + a->stats().deadline_exceeded
        >= static_cast<uint64_t>(failed));
}

TEST_CASE("a stalled receiver makes batches fail at their deadline") {
  const uint64_t len = 64 << 20;
  child_receiver child{len};
  auto a = make(opts_for("a"));
  REQUIRE(!a->connect("child", {child.address.begin(), child.address.end()}));
  std::vector<uint8_t> src_bytes(len, 5);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  {
    waiter w;
    a->post(one_write(*src, 0, *child.region.subrange(0, 4096)), w.sink());
    REQUIRE(!w.get().error);
  }
  child.kill(SIGSTOP);
  auto start = clock_type::now();
  batch b = one_write(*src, 0, child.region);
  b.deadline = start + 500ms;
  waiter w;
  a->post(std::move(b), w.sink());
  auto c = w.get(3s);
  auto took = clock_type::now() - start;
  CHECK(code_of(c.error) == transport_errc::deadline_exceeded);
  CHECK(took >= 500ms);
  CHECK(took < 700ms);
  CHECK(a->stats().deadline_exceeded == 1);
  child.kill(SIGCONT);
}

TEST_CASE("after a dropped peer the next use reconnects") {
  pair_fixture f;
  std::vector<uint8_t> src_bytes = pattern(8192, 9), dst(8192, 0);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.data(), dst.size());
  for (int round = 0; round < 3; ++round) {
    waiter w;
    f.a->post(one_write(*src, 0, reg->describe()), w.sink());
    CHECK(!w.get().error);
    f.a->drop_peer("b");
  }
  CHECK(dst == src_bytes);
  CHECK(f.a->stats().connects >= 3);
}

TEST_CASE("weighted round robin holds the class shares within 5% under "
          "contention") {
  for (auto weights : {std::pair<uint32_t, uint32_t>{3, 1},
                       std::pair<uint32_t, uint32_t>{1, 1}}) {
    auto oa = opts_for("a");
    oa.weight_control = weights.first;
    oa.weight_kv = weights.second;
    auto a = make(oa);
    auto b = make(opts_for("b"));
    link(*a, *b);
    const uint64_t len = 32 << 20;
    std::vector<uint8_t> src_bytes(len, 1), d1(len), d2(len);
    auto src = a->register_region(src_bytes.data(), src_bytes.size());
    auto r1 = b->register_region(d1.data(), d1.size());
    auto r2 = b->register_region(d2.data(), d2.size());
    // Open both connections first, so both classes start together.
    for (auto tc : {traffic_class::control, traffic_class::kv}) {
      waiter w;
      a->post(one_write(*src, 0, *r1->describe().subrange(0, 1), tc), w.sink());
      REQUIRE(!w.get().error);
    }
    waiter wc, wk;
    batch bc, bk;
    for (int i = 0; i < 4; ++i) {
      bc.writes.push_back(write_request{&*src, 0, r1->describe()});
      bk.writes.push_back(write_request{&*src, 0, r2->describe()});
    }
    bc.tclass = traffic_class::control;
    bk.tclass = traffic_class::kv;
    a->post(std::move(bk), wk.sink());
    a->post(std::move(bc), wc.sink());
    CHECK(!wc.get(30s).error);
    CHECK(!wk.get(30s).error);
    auto s = a->stats();
    double c = static_cast<double>(s.contended_bytes[0]);
    double k = static_cast<double>(s.contended_bytes[1]);
    INFO("weights " << weights.first << ":" << weights.second
                    << " contended control=" << c << " kv=" << k);
    REQUIRE(c + k > 8.0 * (1 << 20)); // real contention happened
    double want =
        static_cast<double>(weights.first) / (weights.first + weights.second);
    CHECK(std::abs(c / (c + k) - want) <= 0.05 * want);
  }
}

TEST_CASE("malformed listen addresses and peer details fail with bad_config") {
  auto o = opts_for("a");
  o.listen_host = "localhost-ish";
  auto bad = make_tcp_backend(o);
  REQUIRE(!bad);
  CHECK(code_of(bad.error()) == transport_errc::bad_config);
  auto a = make(opts_for("a"));
  for (std::string details :
       {"no-colon", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000",
        "127.0.0.1:12x", "not-an-ip:4000"}) {
    INFO(details);
    auto err = a->connect("b", {details.begin(), details.end()});
    CHECK(code_of(err) == transport_errc::bad_config);
  }
}
