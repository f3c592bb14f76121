// ctest-label: transport
// The tcp bulk backend over real loopback sockets: byte-exact writes, batches,
// completion semantics, every bad-input case (checked against the receiver's
// counters and canary bytes around the region), authentication, half-open
// connections, deadlines, a receiver process killed mid-batch, reconnection,
// weighted round robin under contention, the OS priorities of every socket
// and thread, completions bound by acknowledgements (against a peer that
// speaks the protocol by hand), bounded queues, kv threads that poll
// through a stream (tcp_kv_spin) and sleep when it ends, and kv batches
// spread over tcp_kv_connections, each batch's immediate after its bytes.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <linux/capability.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "tests/support/support.hpp"
#include "tests/support/thread_sched.hpp"
#include "tests/transport/bulk/raw_client.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/bulk/tcp_handshake.hpp"
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
  // The product's io timeout (2 s), not a short one: on a loaded machine
  // (CI's sanitizer runs) the kv threads, at SCHED_IDLE, can stall a frame
  // for longer than 300 ms, and the receiver then drops the connection as
  // half-open. The case about that timeout sets its own.
  return o;
}

/// opts_for(node) with the kv threads at normal CPU priority: for cases
/// whose kv traffic must progress promptly on a busy machine.
options normal_kv_opts_for(const std::string& node) {
  auto o = opts_for(node);
  o.tcp_kv_sched = tcp_cpu_sched::normal;
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

// Writes 4 KiB from `src` to the start of `dst` and waits until it landed:
// the connection is up (and authenticated) before a test stalls the peer.
void first_write_lands(backend& a, const local_registration& src,
                       const remote_region& dst) {
  waiter w;
  a.post(one_write(src, 0, *dst.subrange(0, 4096)), w.sink());
  REQUIRE(!w.get().error);
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
  int fd = dualpath::test::connect_loopback(static_cast<uint16_t>(port));
  REQUIRE(fd >= 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/// Performs the client side of the handshake on a raw socket.
bool raw_auth(int fd, const std::string& secret) {
  return dualpath::test::raw_bulk_auth(fd, secret, "raw");
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
  auto o = opts_for("b");
  o.io_timeout = 300ms;
  auto b = make(o);
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
  first_write_lands(*a, *src, child.region);
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
  first_write_lands(*a, *src, child.region);
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

TEST_CASE("ending a source's registration fails the batch that reads it "
          "before it returns; a source registered elsewhere is refused") {
  const uint64_t len = 64 << 20;
  child_receiver child{len};
  auto a = make(opts_for("a"));
  REQUIRE(!a->connect("child", {child.address.begin(), child.address.end()}));
  auto src_bytes = std::make_unique<std::vector<uint8_t>>(len, 7);
  auto reg = a->register_region(src_bytes->data(), len);
  REQUIRE(reg);
  std::optional<local_registration> src{std::move(*reg)};
  first_write_lands(*a, *src, child.region);
  // The receiver stalls: 64 MiB cannot all leave, so the sender still reads
  // the source (a frame of it partly written) when its owner ends the
  // registration and frees the memory (a read after that faults: the
  // memory is unmapped; ASan names it).
  child.kill(SIGSTOP);
  auto start = clock_type::now();
  batch b = one_write(*src, 0, child.region);
  b.deadline = start + 5s;
  waiter w;
  a->post(std::move(b), w.sink());
  std::this_thread::sleep_for(100ms); // its first frames are under way
  src.reset();                        // ends the registration
  auto ended = clock_type::now() - start;
  src_bytes.reset();
  auto c = w.get(3s);
  CHECK(code_of(c.error) == transport_errc::unknown_region);
  CHECK(c.failed_ops == 1);
  // Failed at once, not at the deadline; the sender let go of the source
  // before the registration ended (the unmapped memory was not read).
  CHECK(ended < 2s);
  child.kill(SIGCONT);
  // A registration of another backend (its ids overlap ours) is not a
  // source here: refused at once, nothing sent.
  auto other = make(opts_for("other"));
  std::vector<uint8_t> foreign(4096, 1);
  auto theirs = other->register_region(foreign.data(), foreign.size());
  REQUIRE(theirs);
  waiter w2;
  a->post(one_write(*theirs, 0, *child.region.subrange(0, 4096)), w2.sink());
  auto c2 = w2.get(1s);
  CHECK(code_of(c2.error) == transport_errc::unknown_region);
  CHECK(c2.bytes == 0);
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
    // The arbiter shapes the sender; the kv threads run at normal CPU
    // priority here so that it, not the scheduler, decides the shares.
    auto oa = normal_kv_opts_for("a");
    oa.weight_control = weights.first;
    oa.weight_kv = weights.second;
    auto ob = normal_kv_opts_for("b");
    auto a = make(oa);
    auto b = make(ob);
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
    // Both classes backlogged together, in rounds until the sender saw
    // enough contention (on a loaded host the receiver sometimes is the
    // bottleneck and both sockets are rarely writable at once).
    double c = 0, k = 0;
    for (int round = 0; round < 20 && c + k <= 8.0 * (1 << 20); ++round) {
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
      c = static_cast<double>(s.contended_bytes[0]);
      k = static_cast<double>(s.contended_bytes[1]);
    }
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

namespace {

/// The local and peer ports of socket `fd` (0 when not a connected TCP/IPv4
/// socket).
std::pair<uint16_t, uint16_t> ports_of(int fd) {
  sockaddr_in local{}, peer{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0
      || local.sin_family != AF_INET)
    return {0, 0};
  len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0)
    return {ntohs(local.sin_port), 0};
  return {ntohs(local.sin_port), ntohs(peer.sin_port)};
}

int int_sockopt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof(v);
  if (::getsockopt(fd, level, name, &v, &len) != 0)
    return -1;
  return v;
}

uint16_t port_of(backend& be) {
  auto d = be.details_for("x");
  std::string s{d->begin(), d->end()};
  return static_cast<uint16_t>(std::stoi(s.substr(s.rfind(':') + 1)));
}

/// (TOS, SO_PRIORITY) of every open socket matching `pick(local, peer)`.
template <class Pick>
std::vector<std::pair<int, int>> marks_of(Pick pick) {
  std::vector<std::pair<int, int>> out;
  for (int fd = 0; fd < 4096; ++fd) {
    if (int_sockopt(fd, SOL_SOCKET, SO_TYPE) != SOCK_STREAM)
      continue;
    auto [local, peer] = ports_of(fd);
    if (peer != 0 && pick(local, peer))
      out.emplace_back(int_sockopt(fd, IPPROTO_IP, IP_TOS),
                       int_sockopt(fd, SOL_SOCKET, SO_PRIORITY));
  }
  return out;
}

/// Scheduling policy of every thread of this process named `comm`.
std::vector<int> policies_of(const std::string& comm) {
  std::vector<int> out;
  for (auto& thread : dualpath::test::threads_now(comm))
    out.push_back(thread.first);
  return out;
}

} // namespace

TEST_CASE("every socket and thread carries its traffic class's priority") {
  auto o = opts_for("a");
  o.tcp_tos_control = 0xb8;
  o.tcp_priority_control = 6;
  o.tcp_tos_kv = 0x20;
  o.tcp_priority_kv = 1;
  auto a = make(o);
  auto ob = o;
  ob.node = "b";
  auto b = make(ob);
  link(*a, *b);
  std::vector<uint8_t> src_bytes(4096, 1), dst(4096, 0);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = b->register_region(dst.data(), dst.size());
  auto bport = port_of(*b);
  auto to_b = [&](uint16_t, uint16_t peer) { return peer == bport; };
  auto at_b = [&](uint16_t local, uint16_t) { return local == bport; };
  // Control first: exactly one connection, marked as control on both ends.
  {
    waiter w;
    a->post(one_write(*src, 0, reg->describe(), traffic_class::control),
            w.sink());
    REQUIRE(!w.get().error);
  }
  using marks = std::vector<std::pair<int, int>>;
  CHECK(marks_of(to_b) == marks{{0xb8, 6}});
  CHECK(eventually([&] { return marks_of(at_b) == marks{{0xb8, 6}}; }));
  // Then kv: a second connection, marked as kv on both ends.
  {
    waiter w;
    a->post(one_write(*src, 0, reg->describe(), traffic_class::kv), w.sink());
    REQUIRE(!w.get().error);
  }
  auto sorted = [](marks m) {
    std::sort(m.begin(), m.end());
    return m;
  };
  CHECK(sorted(marks_of(to_b)) == marks{{0x20, 1}, {0xb8, 6}});
  CHECK(eventually([&] {
    return sorted(marks_of(at_b)) == marks{{0x20, 1}, {0xb8, 6}};
  }));
  // Threads: two backends, so two of each; kv at SCHED_IDLE (the default),
  // control at the process's normal policy.
  CHECK(policies_of("dp-tcp-tx-kv")
        == std::vector<int>{SCHED_IDLE, SCHED_IDLE});
  CHECK(policies_of("dp-tcp-rx-kv")
        == std::vector<int>{SCHED_IDLE, SCHED_IDLE});
  CHECK(policies_of("dp-tcp-tx-ctl")
        == std::vector<int>{SCHED_OTHER, SCHED_OTHER});
  CHECK(policies_of("dp-tcp-rx-ctl")
        == std::vector<int>{SCHED_OTHER, SCHED_OTHER});
}

TEST_CASE("with tcp_control_cpu both control threads run on that CPU, the kv "
          "threads anywhere") {
  cpu_set_t all;
  REQUIRE(::sched_getaffinity(0, sizeof(all), &all) == 0);
  int cpu = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all))
      cpu = c;
  REQUIRE(cpu >= 0);
  auto o = opts_for("a");
  o.tcp_control_cpu = cpu;
  auto a = make(o);
  // The backend's threads, by name, as (CPUs allowed, `cpu` among them):
  // the control ones allow `cpu` alone, the kv ones every CPU this process
  // may use.
  using mask = std::pair<int, bool>;
  auto masks = [&](const std::string& comm) {
    std::vector<mask> out;
    for (auto tid : dualpath::test::tids_named(comm)) {
      cpu_set_t set;
      CPU_ZERO(&set);
      REQUIRE(::sched_getaffinity(tid, sizeof(set), &set) == 0);
      out.emplace_back(CPU_COUNT(&set), CPU_ISSET(cpu, &set) != 0);
    }
    return out;
  };
  CHECK(masks("dp-tcp-tx-ctl") == std::vector<mask>{{1, true}});
  CHECK(masks("dp-tcp-rx-ctl") == std::vector<mask>{{1, true}});
  CHECK(masks("dp-tcp-tx-kv") == std::vector<mask>{{CPU_COUNT(&all), true}});
  CHECK(masks("dp-tcp-rx-kv") == std::vector<mask>{{CPU_COUNT(&all), true}});
  // A CPU this process may not use: the backend does not start, and says
  // which key.
  auto bad = opts_for("c");
  bad.tcp_control_cpu = CPU_SETSIZE + 7;
  auto c = make_tcp_backend(bad);
  REQUIRE(!c);
  CHECK(to_string(c.error()).find("transport.tcp_control_cpu")
        != std::string::npos);
}

TEST_CASE("a control thread niceness the kernel refuses fails the start") {
  // In a child without CAP_SYS_NICE (dropped if we are root), a negative
  // niceness cannot be applied: the backend does not start, and says why.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (::syscall(SYS_capget, &hdr, data) != 0)
      _exit(10);
    data[CAP_SYS_NICE / 32].effective &= ~(1u << (CAP_SYS_NICE % 32));
    if (::syscall(SYS_capset, &hdr, data) != 0)
      _exit(11);
    auto o = opts_for("a");
    o.tcp_control_nice = -5;
    auto be = make_tcp_backend(o);
    if (be)
      _exit(12);
    if (code_of(be.error()) != transport_errc::system_error)
      _exit(13);
    _exit(to_string(be.error()).find("setpriority") != std::string::npos ? 0
                                                                         : 14);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

namespace {

/// A peer that speaks the protocol by hand: accepts, authenticates, reads
/// frames (discarding payloads) and acknowledges only when told.
struct fake_receiver {
  int listen_fd = -1;
  uint16_t port = 0;
  std::string secret;
  std::thread acceptor;
  std::vector<std::thread> readers;
  std::mutex m;
  std::condition_variable cv;
  struct frame {
    int fd;
    wire::frame_header hdr;
  };
  std::vector<frame> frames;
  std::vector<int> fds;
  std::atomic<bool> stop{false};

  explicit fake_receiver(std::string s) : secret(std::move(s)) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
            == 0);
    REQUIRE(::listen(listen_fd, 8) == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    acceptor = std::thread{[this] { accept_loop(); }};
  }

  ~fake_receiver() {
    stop = true;
    ::shutdown(listen_fd, SHUT_RDWR);
    acceptor.join();
    {
      std::lock_guard<std::mutex> g{m};
      for (auto fd : fds)
        ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : readers)
      t.join();
    for (auto fd : fds)
      ::close(fd);
    ::close(listen_fd);
  }

  std::string address() const {
    return "127.0.0.1:" + std::to_string(port);
  }

  void accept_loop() {
    for (;;) {
      int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0)
        return;
      nonce n;
      auto ch = make_challenge(n);
      wire::hello h{};
      if (::send(fd, &ch, sizeof(ch), MSG_NOSIGNAL) != sizeof(ch)
          || ::recv(fd, &h, sizeof(h), MSG_WAITALL) != sizeof(h)) {
        ::close(fd);
        continue;
      }
      auto peer = check_hello(secret, n, h);
      REQUIRE(peer);
      ::send(fd, &peer->reply, sizeof(peer->reply), MSG_NOSIGNAL);
      std::lock_guard<std::mutex> g{m};
      fds.push_back(fd);
      readers.emplace_back([this, fd] { read_loop(fd); });
    }
  }

  void read_loop(int fd) {
    std::vector<uint8_t> sink(1 << 20);
    for (;;) {
      wire::frame_header h{};
      if (::recv(fd, &h, sizeof(h), MSG_WAITALL) != sizeof(h))
        return;
      for (uint64_t left = h.length; left > 0;) {
        auto n =
            ::recv(fd, sink.data(), std::min<uint64_t>(left, sink.size()), 0);
        if (n <= 0)
          return;
        left -= static_cast<uint64_t>(n);
      }
      std::lock_guard<std::mutex> g{m};
      frames.push_back(frame{fd, h});
      cv.notify_all();
    }
  }

  /// Waits until `n` frames arrived; returns them.
  std::vector<frame> wait_frames(size_t n) {
    std::unique_lock<std::mutex> g{m};
    REQUIRE(cv.wait_for(g, 10s, [&] { return frames.size() >= n; }));
    return frames;
  }

  static void ack(const frame& f,
                  transport_errc status = transport_errc::none) {
    wire::ack a{};
    a.magic = wire::ack_magic;
    a.status = static_cast<uint8_t>(status);
    a.seq = f.hdr.seq;
    REQUIRE(::send(f.fd, &a, sizeof(a), MSG_NOSIGNAL) == sizeof(a));
  }
};

} // namespace

TEST_CASE("a batch completes only when its last frame is acknowledged") {
  fake_receiver fake{"s3cr3t"};
  auto o = opts_for("a");
  o.slice_kib = 1024;
  auto a = make(o);
  auto where = fake.address();
  REQUIRE(!a->connect("fake", {where.begin(), where.end()}));
  std::vector<uint8_t> src_bytes(3 << 20, 7);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  remote_region dst;
  dst.node = "fake";
  dst.region_id = 1;
  dst.key = 9;
  dst.length = 3 << 20;
  std::atomic<int> completions{0};
  std::promise<completion> done;
  a->post(one_write(*src, 0, dst), [&](completion c) {
    ++completions;
    done.set_value(std::move(c));
  });
  auto frames = fake.wait_frames(3); // three 1 MiB frames, all written
  REQUIRE(frames.size() == 3);
  auto fut = done.get_future();
  CHECK(fut.wait_for(200ms) == std::future_status::timeout);
  fake_receiver::ack(frames[0]);
  fake_receiver::ack(frames[1]);
  CHECK(fut.wait_for(200ms) == std::future_status::timeout);
  CHECK(completions == 0);
  fake_receiver::ack(frames[2]);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  auto c = fut.get();
  CHECK(!c.error);
  CHECK(c.bytes == (3u << 20));
  CHECK(completions == 1);
  // A negative acknowledgement fails the batch with the receiver's code.
  waiter w;
  a->post(one_write(*src, 0, *dst.subrange(0, 4096)), w.sink());
  auto more = fake.wait_frames(4);
  fake_receiver::ack(more[3], transport_errc::wrong_key);
  auto bad = w.get();
  CHECK(code_of(bad.error) == transport_errc::wrong_key);
  CHECK(bad.failed_ops == 1);
  // An acknowledgement out of sequence fails what is in flight (bad_frame)
  // and the connection; the next batch reconnects.
  waiter w2;
  a->post(one_write(*src, 0, *dst.subrange(0, 4096)), w2.sink());
  auto garbled = fake.wait_frames(5)[4];
  garbled.hdr.seq += 7;
  fake_receiver::ack(garbled);
  CHECK(code_of(w2.get().error) == transport_errc::bad_frame);
}

TEST_CASE("bounded queues refuse with queue_full per class") {
  fake_receiver fake{"s3cr3t"}; // never acknowledges
  auto o = opts_for("a");
  o.max_pending_batches = 3;
  auto a = make(o);
  auto where = fake.address();
  REQUIRE(!a->connect("fake", {where.begin(), where.end()}));
  std::vector<uint8_t> src_bytes(4096, 7);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  remote_region dst;
  dst.node = "fake";
  dst.region_id = 1;
  dst.key = 9;
  dst.length = 4096;
  std::vector<waiter> kv(4);
  for (auto& w : kv)
    a->post(one_write(*src, 0, dst, traffic_class::kv), w.sink());
  // The fourth is refused at once; the first three stay pending.
  auto refused = kv[3].get(1s);
  CHECK(code_of(refused.error) == transport_errc::queue_full);
  CHECK(refused.failed_ops == 1);
  for (int i = 0; i < 3; ++i)
    CHECK(kv[i].f.wait_for(100ms) == std::future_status::timeout);
  // A full kv queue does not block control.
  waiter ctl;
  a->post(one_write(*src, 0, dst, traffic_class::control), ctl.sink());
  CHECK(ctl.f.wait_for(200ms) == std::future_status::timeout);
  fake.wait_frames(4);
  // Ending the source's registration fails what still reads it, at once
  // (not at the deadline); registrations end before their backend.
  *src = local_registration{};
  for (int i = 0; i < 3; ++i)
    CHECK(code_of(kv[i].get(1s).error) == transport_errc::unknown_region);
  CHECK(code_of(ctl.get(1s).error) == transport_errc::unknown_region);
  a.reset();
}

TEST_CASE("no write completes before its bytes are in the destination") {
  pair_fixture f;
  const size_t region_len = 48 << 20;
  auto src_bytes = pattern(region_len, 11);
  std::vector<uint8_t> dst(region_len, 0);
  auto src = f.a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = f.b->register_region(dst.data(), dst.size());
  std::mt19937 rng{5};
  std::mutex m;
  std::condition_variable cv;
  int outstanding = 0, mismatches = 0, failures = 0;
  size_t off = 0;
  while (off < region_len) {
    size_t len = std::min<size_t>(1 + rng() % (3 << 19), region_len - off);
    batch b = one_write(*src, off, *reg->describe().subrange(off, len),
                        rng() % 2 ? traffic_class::kv : traffic_class::control);
    {
      std::lock_guard<std::mutex> g{m};
      ++outstanding;
    }
    f.a->post(std::move(b), [&, off, len](completion c) {
      // Checked in the sink: the completion must follow the landing.
      bool same =
          std::memcmp(dst.data() + off, src_bytes.data() + off, len) == 0;
      std::lock_guard<std::mutex> g{m};
      mismatches += same ? 0 : 1;
      failures += c.error ? 1 : 0;
      --outstanding;
      cv.notify_all();
    });
    off += len;
  }
  std::unique_lock<std::mutex> g{m};
  REQUIRE(cv.wait_for(g, 30s, [&] { return outstanding == 0; }));
  CHECK(failures == 0);
  CHECK(mismatches == 0);
}

namespace {

/// Sends all of `len` bytes on a blocking socket; false once the peer is
/// gone.
bool send_all(int fd, const void* data, size_t len) {
  auto p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    auto n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0)
      return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

/// Bytes `fd` has sent that the receiving kernel has not acknowledged.
int unacked(int fd) {
  int n = 0;
  REQUIRE(::ioctl(fd, SIOCOUTQ, &n) == 0);
  return n;
}

} // namespace

TEST_CASE("drop_peer stops a write the peer had begun: no byte of it lands "
          "after the return, and the peer can reconnect") {
  // A peer played by hand, so that it is mid-frame for sure when dropped:
  // the header and the first part of the payload, then the drop, then the
  // rest. The kv threads run at normal priority so the first part is read
  // promptly on a busy machine.
  auto b = make(normal_kv_opts_for("b"));
  for (auto tc : {traffic_class::control, traffic_class::kv}) {
    CAPTURE(static_cast<int>(tc));
    const size_t len = 2 << 20, first = 768 << 10;
    std::vector<uint8_t> dst(len, 0);
    auto reg = b->register_region(dst.data(), dst.size());
    REQUIRE(reg);
    auto d = reg->describe();
    auto payload = pattern(len, 21 + static_cast<uint32_t>(tc));
    int fd = connect_raw(*b);
    REQUIRE(dualpath::test::raw_bulk_auth(fd, "s3cr3t", "p",
                                          static_cast<uint8_t>(tc)));
    auto h = wire::make_header(d.region_id, d.key, 0, len, tc);
    REQUIRE(send_all(fd, &h, sizeof(h)));
    REQUIRE(send_all(fd, payload.data(), first));
    // The receiving kernel has the first part; give the thread time to
    // read it (checked below, after the drop, without racing the thread).
    REQUIRE(eventually([&] { return unacked(fd) == 0; }));
    std::this_thread::sleep_for(200ms);
    b->drop_peer("p");
    // drop_peer() synchronised with the receive threads: reading is safe.
    auto at_return = dst;
    size_t landed = 0;
    while (landed < len && at_return[landed] == payload[landed])
      ++landed;
    CHECK(landed > 0);   // it was mid-frame...
    CHECK(landed < len); // ...and the frame was not finished
    CHECK(std::all_of(at_return.begin() + static_cast<ptrdiff_t>(landed),
                      at_return.end(), [](uint8_t x) { return x == 0; }));
    // The peer goes on: the rest of the frame, and a second whole frame.
    send_all(fd, payload.data() + first, len - first);
    auto h2 = wire::make_header(d.region_id, d.key, 0, len, tc);
    h2.seq = 1;
    send_all(fd, &h2, sizeof(h2));
    send_all(fd, payload.data(), len);
    CHECK(closed_by_peer(fd)); // and no acknowledgement
    ::close(fd);
    std::this_thread::sleep_for(200ms);
    CHECK(dst == at_return);
    // A new connection of the same peer is served.
    fd = connect_raw(*b);
    REQUIRE(dualpath::test::raw_bulk_auth(fd, "s3cr3t", "p",
                                          static_cast<uint8_t>(tc)));
    h.seq = 7;
    REQUIRE(send_all(fd, &h, sizeof(h)));
    REQUIRE(send_all(fd, payload.data(), len));
    wire::ack a{};
    REQUIRE(::recv(fd, &a, sizeof(a), MSG_WAITALL) == sizeof(a));
    CHECK(a.magic == wire::ack_magic);
    CHECK(a.status == 0);
    CHECK(a.seq == 7);
    ::close(fd);
    CHECK(dst == payload);
  }
}

TEST_CASE("a kv receiver reads a payload once a whole kv call of it is "
          "there, and not before") {
  // A sender played by hand sends a frame's header, then a piece of its
  // payload; the drop synchronises with the receive thread, so the region
  // is read without racing it. Half a call is not read; a whole call is,
  // and no more (the receiver wakes as a sender's call ends, not amid it).
  constexpr size_t chunk = 64 << 10, len = 1 << 20;
  auto o = normal_kv_opts_for("b");
  o.tcp_kv_chunk_kib = chunk >> 10;
  o.io_timeout = 5s;
  auto b = make(o);
  std::vector<uint8_t> dst(len, 0x5a);
  auto reg = b->register_region(dst.data(), dst.size());
  REQUIRE(reg);
  auto d = reg->describe();
  auto payload = pattern(len, 41);
  auto untouched_from = [&](size_t from) {
    return std::all_of(dst.begin() + static_cast<ptrdiff_t>(from), dst.end(),
                       [](uint8_t x) { return x == 0x5a; });
  };
  for (size_t sent : {chunk / 2, chunk}) {
    CAPTURE(sent);
    int fd = connect_raw(*b);
    REQUIRE(dualpath::test::raw_bulk_auth(fd, "s3cr3t", "p", 1));
    auto h = wire::make_header(d.region_id, d.key, 0, len, traffic_class::kv);
    REQUIRE(send_all(fd, &h, sizeof(h)));
    // The header alone first: a read right after it takes what is queued
    // whatever the threshold, so the piece must come after that read (the
    // kv thread runs at normal priority; 300 ms is slack for a busy CI).
    std::this_thread::sleep_for(300ms);
    REQUIRE(send_all(fd, payload.data(), sent));
    REQUIRE(eventually([&] { return unacked(fd) == 0; }));
    std::this_thread::sleep_for(300ms);
    b->drop_peer("p");
    if (sent < chunk) {
      CHECK(untouched_from(0));
    } else {
      CHECK(std::equal(payload.begin(),
                       payload.begin() + static_cast<ptrdiff_t>(chunk),
                       dst.begin()));
      CHECK(untouched_from(chunk));
    }
    ::close(fd);
    std::fill(dst.begin(), dst.end(), uint8_t{0x5a});
  }
}

TEST_CASE("drop_peer on the receiving backend cuts a large write of a real "
          "peer: nothing lands after the return, the sender's batch fails, "
          "its next post reconnects") {
  auto a = make(normal_kv_opts_for("a"));
  auto b = make(normal_kv_opts_for("b"));
  link(*a, *b);
  const size_t len = 64 << 20;
  auto src_bytes = pattern(len, 31);
  std::vector<uint8_t> dst(len, 0);
  auto src = a->register_region(src_bytes.data(), src_bytes.size());
  auto reg = b->register_region(dst.data(), dst.size());
  // Open the connection first, so the write below starts at once.
  {
    waiter w;
    a->post(one_write(*src, 0, *reg->describe().subrange(0, 1)), w.sink());
    REQUIRE(!w.get().error);
  }
  auto sent_before = a->stats().bytes_sent[1];
  waiter w;
  a->post(one_write(*src, 0, reg->describe()), w.sink());
  REQUIRE(eventually(
      [&] { return a->stats().bytes_sent[1] >= sent_before + (8 << 20); }, 5s));
  b->drop_peer("a");
  auto at_return = dst;
  auto c = w.get();
  std::this_thread::sleep_for(200ms);
  CHECK(dst == at_return);
  CHECK(at_return != src_bytes); // cut mid-write
  CHECK(code_of(c.error) == transport_errc::peer_lost);
  // The next post reconnects and lands every byte.
  waiter again;
  a->post(one_write(*src, 0, reg->describe()), again.sink());
  CHECK(!again.get(20s).error);
  CHECK(dst == src_bytes);
}

TEST_CASE("drop_peer from an immediate handler returns at once and the "
          "frames behind the immediate do not land") {
  auto b = make(opts_for("b"));
  const size_t len = 64 << 10;
  std::vector<uint8_t> dst(2 * len, 0);
  auto reg = b->register_region(dst.data(), dst.size());
  auto d = reg->describe();
  auto payload = pattern(2 * len, 41);
  std::promise<void> dropped;
  b->on_immediate([&](const incoming_immediate& x) {
    if (x.from_node == "p" && x.value == 5) {
      b->drop_peer("p"); // on the receive thread: must not wait for itself
      dropped.set_value();
    }
  });
  int fd = connect_raw(*b);
  REQUIRE(dualpath::test::raw_bulk_auth(fd, "s3cr3t", "p"));
  // Frame 1 (first half, immediate 5) and frame 2 (second half) in one go.
  auto h1 =
      wire::make_header(d.region_id, d.key, 0, len, traffic_class::control);
  wire::set_immediate(h1, 5);
  h1.seq = 1;
  auto h2 =
      wire::make_header(d.region_id, d.key, len, len, traffic_class::control);
  h2.seq = 2;
  std::vector<uint8_t> wire_bytes;
  auto put = [&](const void* p, size_t n) {
    auto c = static_cast<const uint8_t*>(p);
    wire_bytes.insert(wire_bytes.end(), c, c + n);
  };
  put(&h1, sizeof(h1));
  put(payload.data(), len);
  put(&h2, sizeof(h2));
  put(payload.data() + len, len);
  REQUIRE(send_all(fd, wire_bytes.data(), wire_bytes.size()));
  auto got = dropped.get_future();
  REQUIRE(got.wait_for(5s) == std::future_status::ready);
  CHECK(closed_by_peer(fd));
  ::close(fd);
  std::this_thread::sleep_for(100ms);
  b->on_immediate({});
  // Synchronised by the handler's promise and the closed connection.
  CHECK(std::memcmp(dst.data(), payload.data(), len) == 0);
  CHECK(std::all_of(dst.begin() + static_cast<ptrdiff_t>(len), dst.end(),
                    [](uint8_t x) { return x == 0; }));
}

namespace {

/// A stream of `total` bytes of 1 MiB kv writes from `a` to `b`, at most 16
/// in flight; true when every write completed without error and `dst`
/// holds `src` byte for byte.
bool kv_stream(backend& a, const local_registration& src,
               const remote_region& dst_region,
               const std::vector<uint8_t>& src_bytes,
               const std::vector<uint8_t>& dst, size_t total) {
  const size_t len = 1 << 20;
  std::mutex m;
  std::condition_variable cv;
  int outstanding = 0, failures = 0;
  for (size_t off = 0; off < total; off += len) {
    std::unique_lock<std::mutex> g{m};
    cv.wait(g, [&] { return outstanding < 16; });
    ++outstanding;
    g.unlock();
    a.post(one_write(src, off, *dst_region.subrange(off, len)),
           [&](completion c) {
             std::lock_guard<std::mutex> g2{m};
             failures += c.error ? 1 : 0;
             --outstanding;
             cv.notify_all();
           });
  }
  std::unique_lock<std::mutex> g{m};
  if (!cv.wait_for(g, 60s, [&] { return outstanding == 0; }))
    return false;
  return failures == 0 && std::memcmp(dst.data(), src_bytes.data(), total) == 0;
}

/// `src` registered at `a` and `dst` at `b`, both required to succeed.
std::pair<local_registration, local_registration>
registered(backend& a, std::vector<uint8_t>& src, backend& b,
           std::vector<uint8_t>& dst) {
  auto s = a.register_region(src.data(), src.size());
  auto d = b.register_region(dst.data(), dst.size());
  REQUIRE(s);
  REQUIRE(d);
  return {std::move(*s), std::move(*d)};
}

struct spin_counts {
  uint64_t hits = 0;
  uint64_t sleeps = 0;
};

spin_counts counts_of(const backend& a, const backend& b) {
  auto sa = a.stats();
  auto sb = b.stats();
  return {sa.kv_spin_hits + sb.kv_spin_hits, sa.kv_sleeps + sb.kv_sleeps};
}

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

/// Backends "a" and "b", kv threads at normal priority polling `spin`,
/// "a" connected to "b".
std::pair<std::unique_ptr<backend>, std::unique_ptr<backend>>
spinning_pair(std::chrono::microseconds spin) {
  auto oa = normal_kv_opts_for("a");
  auto ob = normal_kv_opts_for("b");
  oa.tcp_kv_spin = ob.tcp_kv_spin = spin;
  auto a = make(oa);
  auto b = make(ob);
  link(*a, *b);
  return {std::move(a), std::move(b)};
}

} // namespace

TEST_CASE("kv threads poll through a stream instead of sleeping, and sleep "
          "when it ends") {
  const size_t total = 64 << 20;
  auto src_bytes = pattern(total, 21);
  spin_counts during[2];
  const std::chrono::microseconds spins[2] = {0us, 10000us};
  for (int k = 0; k < 2; ++k) {
    CAPTURE(spins[k].count());
    auto [a, b] = spinning_pair(spins[k]);
    std::vector<uint8_t> dst(total, 0);
    auto [src, reg] = registered(*a, src_bytes, *b, dst);
    auto before = counts_of(*a, *b);
    REQUIRE(kv_stream(*a, src, reg.describe(), src_bytes, dst, total));
    auto after = counts_of(*a, *b);
    during[k] = {after.hits - before.hits, after.sleeps - before.sleeps};
    MESSAGE("tcp_kv_spin " << spins[k].count() << " us: " << during[k].hits
                           << " waits answered polling, " << during[k].sleeps
                           << " slept, over 64 MiB");
    // Once the stream is over no kv thread polls: a quiet backend pair
    // sleeps, costing the process (almost) no CPU.
    std::this_thread::sleep_for(50ms); // the last spin ends
    auto idle_from = counts_of(*a, *b);
    auto cpu_from = process_cpu_seconds();
    std::this_thread::sleep_for(300ms);
    auto idle_to = counts_of(*a, *b);
    CHECK(idle_to.hits == idle_from.hits);
    CHECK(process_cpu_seconds() - cpu_from < 0.1);
  }
  // Without a spin no wait is answered by polling; with one, waits are. How
  // many depends on the load: the receiver polls between frames for only
  // 100 us (the spin covers a frame's rest), so beside two compilers 16 of
  // 89 waits were answered polling (2026-12-05), over a third on a quiet
  // host.
  CHECK(during[0].hits == 0);
  CHECK(during[0].sleeps > 0);
  CHECK(during[1].hits > 0);
}

TEST_CASE("a kv receive thread polls through a frame's rest, not past a "
          "stream's last frame") {
  // With the longest spin allowed, a receive thread that kept polling after
  // the last frame would spend most of the first 10 ms after the stream
  // polling; it polls at most between_frames_spin (100 us) once no frame
  // is under way, and the sender lane none once its batches are done.
  const size_t total = 16 << 20;
  auto src_bytes = pattern(total, 22);
  auto [a, b] = spinning_pair(10000us);
  std::vector<uint8_t> dst(total, 0);
  auto [src, reg] = registered(*a, src_bytes, *b, dst);
  auto before = counts_of(*a, *b);
  REQUIRE(kv_stream(*a, src, reg.describe(), src_bytes, dst, total));
  // The stream's waits were answered by polling...
  auto during = counts_of(*a, *b);
  CHECK(during.hits > before.hits);
  // ... and right after its last completion the pair goes quiet: the CPU
  // of the next 10 ms (the spin) is well under what polling through it
  // costs (~10 ms of a core).
  auto cpu_from = process_cpu_seconds();
  std::this_thread::sleep_for(10ms);
  auto used = process_cpu_seconds() - cpu_from;
  MESSAGE("CPU in the 10 ms after the stream: " << used * 1e3 << " ms");
  CHECK(used < 0.004);
}

TEST_CASE("kv system calls shrink while control traffic flows, on both "
          "ends, and stay large without it") {
  const size_t total = 32 << 20;
  auto src_bytes = pattern(total, 23);
  auto yield_calls = [](const backend& x) { return x.stats().kv_yield_calls; };
  // k = 0: kv alone; 1: kv with a control stream; 2: the same with
  // tcp_kv_yield 0 (never shrink).
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    auto oa = normal_kv_opts_for("a");
    auto ob = normal_kv_opts_for("b");
    oa.tcp_kv_chunk_kib = ob.tcp_kv_chunk_kib = 256;
    oa.tcp_kv_yield_chunk_kib = ob.tcp_kv_yield_chunk_kib = 16;
    if (k == 2)
      oa.tcp_kv_yield = ob.tcp_kv_yield = 0ms;
    auto a = make(oa);
    auto b = make(ob);
    link(*a, *b);
    std::vector<uint8_t> dst(total, 0);
    auto [src, reg] = registered(*a, src_bytes, *b, dst);
    std::vector<uint8_t> csrc = pattern(4096, 24), cdst(4096, 0);
    // Not structured bindings: the control thread's lambda captures them.
    auto cregs = registered(*a, csrc, *b, cdst);
    auto& cs = std::get<0>(cregs);
    auto& cr = std::get<1>(cregs);
    std::atomic<bool> stop{false};
    std::atomic<int> control_writes{0}, control_failures{0};
    std::thread control;
    if (k > 0)
      control = std::thread{[&] {
        while (!stop) {
          waiter w;
          a->post(one_write(cs, 0, cr.describe(), traffic_class::control),
                  w.sink());
          control_failures += w.get().error ? 1 : 0;
          control_writes += 1;
          std::this_thread::sleep_for(200us);
        }
      }};
    if (k > 0) // control has been seen before the stream starts
      CHECK(eventually([&] { return control_writes.load() > 0; }));
    bool ok = kv_stream(*a, src, reg.describe(), src_bytes, dst, total);
    stop = true;
    if (control.joinable())
      control.join();
    CHECK(ok); // every kv byte in place, whatever the call size
    CHECK(control_failures == 0);
    if (k > 0)
      CHECK(cdst == csrc);
    MESSAGE("case " << k << ": kv calls held short: sender " << yield_calls(*a)
                    << ", receiver " << yield_calls(*b) << "; control writes "
                    << control_writes.load());
    if (k == 1) {
      CHECK(yield_calls(*a) > 0);
      CHECK(yield_calls(*b) > 0);
    } else {
      CHECK(yield_calls(*a) == 0);
      CHECK(yield_calls(*b) == 0);
    }
  }
}

TEST_CASE("kv batches spread over tcp_kv_connections connections; each "
          "batch's immediate follows all of its bytes") {
  const size_t batch_len = 4 << 20; // 4 writes of 1 MiB, one frame each
  const size_t batches = 24;
  const size_t total = batch_len * batches;
  auto src_bytes = pattern(total, 31);
  for (uint32_t conns : {1u, 3u}) {
    CAPTURE(conns);
    auto oa = normal_kv_opts_for("a");
    oa.tcp_kv_connections = conns;
    auto a = make(oa);
    auto b = make(normal_kv_opts_for("b"));
    link(*a, *b);
    std::vector<uint8_t> dst(total, 0);
    auto [src, reg] = registered(*a, src_bytes, *b, dst);
    std::mutex m;
    std::condition_variable cv;
    std::vector<int> signalled(batches, 0);
    int early = 0, completed = 0, failures = 0;
    b->on_immediate([&](const incoming_immediate& x) {
      // Every byte of the batch is in place when its immediate arrives.
      auto off = size_t{x.value} * batch_len;
      bool whole =
          x.value < batches
          && std::memcmp(dst.data() + off, src_bytes.data() + off, batch_len)
                 == 0;
      std::lock_guard<std::mutex> g{m};
      early += whole ? 0 : 1;
      if (x.value < batches)
        signalled[x.value] += 1;
      cv.notify_all();
    });
    for (uint32_t k = 0; k < batches; ++k) {
      batch bt;
      bt.tclass = traffic_class::kv;
      bt.immediate = k;
      for (size_t w = 0; w < 4; ++w) {
        auto off = k * batch_len + w * (1 << 20);
        bt.writes.push_back(
            write_request{&src, off, *reg.describe().subrange(off, 1 << 20)});
      }
      a->post(std::move(bt), [&](completion c) {
        std::lock_guard<std::mutex> g{m};
        failures += c.error ? 1 : 0;
        ++completed;
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> g{m};
    REQUIRE(cv.wait_for(g, 60s, [&] {
      return completed == static_cast<int>(batches)
             && std::count(signalled.begin(), signalled.end(), 1)
                    == static_cast<long>(batches);
    }));
    CHECK(failures == 0);
    CHECK(early == 0);
    CHECK(std::memcmp(dst.data(), src_bytes.data(), total) == 0);
    g.unlock();
    // The kv connections a opened to b (TOS marks kv), one per configured
    // connection: 24 batches in flight at once keep every one busy.
    auto bport = port_of(*b);
    auto kv_to_b =
        marks_of([&](uint16_t, uint16_t peer) { return peer == bport; });
    auto kv = std::count(kv_to_b.begin(), kv_to_b.end(),
                         std::pair<int, int>{0x20, 1});
    CHECK(kv == static_cast<long>(conns));
    CHECK(a->stats().connects == conns);
  }
}
