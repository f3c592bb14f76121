// ctest-label: transport
// The verbs backend on real RDMA devices (Soft-RoCE in the rdma-vm guest:
// tests/rdma/vm-check): the handshake between two processes, byte-exact RDMA
// WRITEs with immediates from 4 KiB to 16 MiB, bad destinations refused
// locally with the peer still usable, a peer killed mid-transfer (every
// pending batch fails within its deadline), reconnecting to a restarted
// peer, the sender's port going down and up again (in the guest only),
// 100,000 small writes with selective signalling, a wrong secret, and
// settings that do not fit the device. The receiving peer is this binary
// run again as a child process (DUALPATH_VERBS_PEER=1). Devices: the sender
// uses $DUALPATH_VERBS_DEVICE, the receiver $DUALPATH_VERBS_PEER_DEVICE
// (default: the first device for both). Skips, saying why, only where the
// host has no RDMA device.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "config/errors.hpp"
#include "tests/support/support.hpp"
#include "tests/support/thread_sched.hpp"
#include "tests/transport/bulk/post_wait.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/bulk/verbs_backend.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;
using namespace std::chrono_literals;

namespace {

const char* secret = "verbs-test-secret";

std::string env_or(const char* name, const char* fallback) {
  auto v = std::getenv(name);
  return v ? v : fallback;
}

options verbs_options(const std::string& node, const std::string& device) {
  options o;
  o.node = node;
  o.secret = secret;
  o.verbs_device = device;
  return o;
}

/// Byte `i` of the pattern with `seed` (KV-like: a pure function of where).
uint8_t pattern(uint64_t i, uint32_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 56);
}

std::unique_ptr<backend> open_or_skip(options o) {
  auto b = make_verbs_backend(o);
  if (!b && b.error().code() == static_cast<uint8_t>(transport_errc::no_device)
      && std::getenv("DUALPATH_VERBS_REQUIRED") == nullptr)
    dualpath::test::skip_suite("transport.bulk.verbs_backend",
                               "no RDMA device: "
                                   + dualpath::config::message_of(b.error()));
  REQUIRE_MESSAGE(b, (b ? "" : dualpath::config::message_of(b.error())));
  return std::move(*b);
}

// -- the receiving peer (a child process) -------------------------------------

/// Runs in the child: one region of $SIZE bytes; answers commands on stdin
/// (CHECK off len seed, ZERO off len, COUNT, QUIT) on stdout. With
/// $DUALPATH_VERBS_PEER_VERIFY = c, each immediate v > 0 is checked as it
/// arrives: the c bytes at (v-1)*c must already be the pattern with seed v
/// (COUNT's third number counts those that were not).
int peer_main() {
  auto o = verbs_options(env_or("DUALPATH_VERBS_PEER_NAME", "peer"),
                         env_or("DUALPATH_VERBS_PEER_DEVICE", ""));
  auto b = make_verbs_backend(o);
  if (!b) {
    std::cout << "FAIL " << dualpath::config::message_of(b.error())
              << std::endl;
    return 1;
  }
  std::vector<uint8_t> buf(
      std::stoull(env_or("DUALPATH_VERBS_PEER_SIZE", "0")));
  auto reg = (*b)->register_region(buf.data(), buf.size());
  if (!reg) {
    std::cout << "FAIL " << dualpath::config::message_of(reg.error())
              << std::endl;
    return 1;
  }
  std::atomic<uint64_t> imms{0};
  std::atomic<uint32_t> last{0};
  std::atomic<uint64_t> early{0};
  const uint64_t verify =
      std::stoull(env_or("DUALPATH_VERBS_PEER_VERIFY", "0"));
  (*b)->on_immediate([&](const incoming_immediate& x) {
    if (verify > 0 && x.value > 0) {
      uint64_t off = (x.value - 1) * verify;
      for (uint64_t i = 0; i < verify; ++i)
        if (off + i >= buf.size()
            || buf[off + i] != pattern(off + i, x.value)) {
          ++early;
          break;
        }
    }
    last = x.value;
    ++imms;
  });
  auto d = *(*b)->details_for("");
  auto& r = reg->describe();
  std::cout << "READY " << std::string{d.begin(), d.end()} << " " << r.region_id
            << " " << r.key << " " << r.length << std::endl;
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "CHECK") {
      uint64_t off = 0, len = 0;
      uint32_t seed = 0;
      std::cin >> off >> len >> seed;
      uint64_t bad = len;
      for (uint64_t i = 0; i < len && bad == len; ++i)
        if (buf[off + i] != pattern(off + i, seed))
          bad = i;
      if (bad == len)
        std::cout << "OK" << std::endl;
      else
        std::cout << "BAD " << bad << std::endl;
    } else if (cmd == "ZERO") {
      uint64_t off = 0, len = 0;
      std::cin >> off >> len;
      bool zero = std::all_of(buf.begin() + off, buf.begin() + off + len,
                              [](uint8_t v) { return v == 0; });
      std::cout << (zero ? "OK" : "BAD") << std::endl;
    } else if (cmd == "COUNT") {
      std::cout << "COUNT " << imms.load() << " " << last.load() << " "
                << early.load() << std::endl;
    } else {
      break;
    }
  }
  return 0;
}

// Runs before doctest's main in the child.
const bool peer_mode = [] {
  if (std::getenv("DUALPATH_VERBS_PEER") != nullptr)
    std::exit(peer_main());
  return false;
}();

/// The parent's handle on a peer process.
class peer_process {
public:
  peer_process(uint64_t size, const std::string& name = "peer",
               uint64_t verify = 0)
      : name_(name) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      ::setenv("DUALPATH_VERBS_PEER", "1", 1);
      ::setenv("DUALPATH_VERBS_PEER_NAME", name.c_str(), 1);
      ::setenv("DUALPATH_VERBS_PEER_SIZE", std::to_string(size).c_str(), 1);
      ::setenv("DUALPATH_VERBS_PEER_VERIFY", std::to_string(verify).c_str(), 1);
      ::execl("/proc/self/exe", "verbs-peer", nullptr);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    auto ready = line(30s);
    std::istringstream is{ready};
    std::string word, details;
    is >> word >> details >> region.region_id >> region.key >> region.length;
    REQUIRE_MESSAGE(word == "READY", ready);
    region.node = name;
    this->details.assign(details.begin(), details.end());
  }

  ~peer_process() {
    kill();
    ::close(to_);
    ::close(from_);
  }

  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  /// One line of the peer's output ("" on timeout or end).
  std::string line(std::chrono::milliseconds limit) {
    auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        auto l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return "";
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        continue;
      char tmp[4096];
      auto n = ::read(from_, tmp, sizeof(tmp));
      if (n <= 0)
        return "";
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  std::string ask(const std::string& cmd) {
    auto s = cmd + "\n";
    REQUIRE(::write(to_, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
    return line(60s);
  }

  bool check(uint64_t off, uint64_t len, uint32_t seed) {
    auto r = ask("CHECK " + std::to_string(off) + " " + std::to_string(len)
                 + " " + std::to_string(seed));
    INFO("peer says " << r);
    return r == "OK";
  }

  /// Immediates received so far and the last value.
  std::pair<uint64_t, uint32_t> immediates() {
    std::istringstream is{ask("COUNT")};
    std::string word;
    uint64_t n = 0;
    uint32_t v = 0;
    is >> word >> n >> v;
    return {n, v};
  }

  /// Immediates that arrived before the bytes they announce (verify mode).
  uint64_t early_immediates() {
    std::istringstream is{ask("COUNT")};
    std::string word;
    uint64_t n = 0, early = 0;
    uint32_t v = 0;
    is >> word >> n >> v >> early;
    return early;
  }

  remote_region region;
  std::vector<uint8_t> details;

private:
  std::string name_;
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string buf_;
};

completion run(backend& b, batch x, std::chrono::seconds limit = 60s) {
  return dualpath::test::post_and_wait(b, std::move(x), limit);
}

transport_errc code_of(const completion& c) {
  return static_cast<transport_errc>(c.error.code());
}

/// The sender: a registered source buffer of `size` bytes.
struct sender {
  std::unique_ptr<backend> be;
  std::vector<uint8_t> src;
  local_registration reg;
  explicit sender(
      uint64_t size,
      options o = verbs_options("sender", env_or("DUALPATH_VERBS_DEVICE", "")))
      : be(open_or_skip(o)), src(size) {
    auto r = be->register_region(src.data(), src.size());
    REQUIRE(r);
    reg = std::move(*r);
  }
  ~sender() {
    reg = local_registration{};
  }
  void fill(uint64_t off, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; ++i)
      src[off + i] = pattern(off + i, seed);
  }
  batch write(const remote_region& dst, uint64_t off, uint64_t len,
              std::optional<uint32_t> imm = std::nullopt) {
    batch b;
    b.writes.push_back({&reg, off, *dst.subrange(off, len)});
    b.immediate = imm;
    return b;
  }
};

/// `n` kv batches of `chunk` bytes from the sender's first chunk to
/// `region` (64 chunks round robin), each due `deadline` after the first;
/// the constructor returns once the first has completed.
class in_flight {
public:
  in_flight(sender& s, const remote_region& region, uint64_t chunk, int n,
            std::chrono::seconds deadline)
      : n_(static_cast<size_t>(n)), deadline_(deadline) {
    start = clock_type::now();
    for (int i = 0; i < n; ++i) {
      auto b = s.write(region, (i % 64) * chunk, chunk);
      b.writes[0].source_offset = 0;
      b.tclass = traffic_class::kv;
      b.deadline = start + deadline;
      s.be->post(std::move(b), [this](completion c) {
        std::lock_guard<std::mutex> guard{mtx_};
        done_.emplace_back(std::move(c), clock_type::now());
        cv_.notify_all();
      });
    }
    std::unique_lock<std::mutex> guard{mtx_};
    REQUIRE(cv_.wait_for(guard, 60s, [&] { return !done_.empty(); }));
  }

  /// Every completion with when it came, once all came (within the
  /// deadline and 10 s more).
  const std::vector<std::pair<completion, clock_type::time_point>>& all() {
    std::unique_lock<std::mutex> guard{mtx_};
    REQUIRE(cv_.wait_for(guard, deadline_ + 10s,
                         [&] { return done_.size() == n_; }));
    return done_;
  }

  clock_type::time_point start;

private:
  size_t n_;
  std::chrono::seconds deadline_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::vector<std::pair<completion, clock_type::time_point>> done_;
};

} // namespace

// -- checks that need no device (they run first) ------------------------------

TEST_CASE("verbs settings out of range are refused naming the key") {
  auto o = verbs_options("a", "");
  o.verbs_hop_limit = 0;
  auto b = make_verbs_backend(o);
  REQUIRE(!b);
  CHECK(
      dualpath::config::message_of(b.error()).find("transport.verbs_hop_limit")
      != std::string::npos);
  o = verbs_options("a", "");
  o.verbs_traffic_class_kv = 256;
  b = make_verbs_backend(o);
  REQUIRE(!b);
  CHECK(dualpath::config::message_of(b.error()).find(
            "transport.verbs_traffic_class_kv")
        != std::string::npos);
  for (uint32_t lanes : {0u, 9u}) {
    o = verbs_options("a", "");
    o.verbs_kv_queue_pairs = lanes;
    b = make_verbs_backend(o);
    REQUIRE(!b);
    CHECK(dualpath::config::message_of(b.error()).find(
              "transport.verbs_kv_queue_pairs")
          != std::string::npos);
  }
  o = verbs_options("a", "");
  o.verbs_sl_control = 16;
  b = make_verbs_backend(o);
  REQUIRE(!b);
  CHECK(
      dualpath::config::message_of(b.error()).find("transport.verbs_sl_control")
      != std::string::npos);
}

// -- on a device
// ---------------------------------------------------------------

TEST_CASE("a GID index the port lacks and an unknown device name the key") {
  auto o = verbs_options("a", env_or("DUALPATH_VERBS_DEVICE", ""));
  open_or_skip(o); // skips the suite without a device
  o.verbs_gid_index = 250;
  auto b = make_verbs_backend(o);
  REQUIRE(!b);
  CHECK(
      dualpath::config::message_of(b.error()).find("transport.verbs_gid_index")
      != std::string::npos);
  o = verbs_options("a", "no-such-device");
  b = make_verbs_backend(o);
  REQUIRE(!b);
  CHECK(static_cast<transport_errc>(b.error().code())
        == transport_errc::no_device);
  CHECK(dualpath::config::message_of(b.error()).find("no-such-device")
        != std::string::npos);
}

TEST_CASE("writes with immediates land byte-exact from 4 KiB to 16 MiB") {
  const uint64_t size = 32u << 20;
  peer_process peer{size};
  sender s{size};
  REQUIRE(!s.be->connect("peer", peer.details));
  uint64_t off = 0;
  uint32_t seed = 1;
  for (uint64_t len : {4096ull, 65536ull, 1ull << 20, 16ull << 20}) {
    s.fill(off, len, seed);
    auto c = run(*s.be, s.write(peer.region, off, len, seed));
    REQUIRE_MESSAGE(!c.error, dualpath::config::message_of(c.error));
    CHECK(c.bytes == len);
    // The immediate arrives after the bytes it announces.
    std::pair<uint64_t, uint32_t> got;
    for (int i = 0; i < 200; ++i) {
      got = peer.immediates();
      if (got.first == seed)
        break;
      std::this_thread::sleep_for(10ms);
    }
    CHECK(got.first == seed);
    CHECK(got.second == seed);
    CHECK(peer.check(off, len, seed));
    off += len + 4097; // unaligned offsets too
    ++seed;
  }
  // Both traffic classes, several writes in one batch.
  batch b;
  b.tclass = traffic_class::control;
  s.fill(0, 3 * 65536, 99);
  for (uint64_t k = 0; k < 3; ++k)
    b.writes.push_back(
        {&s.reg, k * 65536, *peer.region.subrange(k * 65536, 65536)});
  auto c = run(*s.be, std::move(b));
  CHECK(!c.error);
  CHECK(peer.check(0, 3 * 65536, 99));
  // A burst of small KV batches: most signal no completion of their own
  // (a later batch's, or a fence's, retires them); every one completes.
  s.fill(0, 20 * 4096, 42);
  std::mutex mtx;
  std::condition_variable cv;
  int ok = 0, failed = 0;
  for (uint64_t k = 0; k < 20; ++k) {
    auto x = s.write(peer.region, k * 4096, 4096);
    s.be->post(std::move(x), [&](completion c) {
      std::lock_guard<std::mutex> guard{mtx};
      ++(c.error ? failed : ok);
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> guard{mtx};
    REQUIRE(cv.wait_for(guard, 30s, [&] { return ok + failed == 20; }));
  }
  CHECK(ok == 20);
  CHECK(peer.check(0, 20 * 4096, 42));
  CHECK(s.be->stats().connects == 1);
}

TEST_CASE("KV batches spread over every KV queue pair, each immediate after "
          "its own bytes") {
  // Three KV lanes towards a peer left at the default (it makes as many
  // queue pairs as the sender asks for). 96 batches of 256 KiB, each with
  // its own pattern and an immediate naming it, posted at once: they go on
  // the least loaded lane, so all three carry some, and since a batch and
  // its immediate stay on one queue pair the peer finds every batch's
  // bytes in place when its immediate arrives, whatever the order across
  // lanes.
  const uint64_t chunk = 256 << 10;
  const uint32_t n = 96;
  peer_process peer{chunk * n, "peer", chunk};
  auto o = verbs_options("sender", env_or("DUALPATH_VERBS_DEVICE", ""));
  o.verbs_kv_queue_pairs = 3;
  sender s{chunk * n, o};
  REQUIRE(!s.be->connect("peer", peer.details));
  for (uint32_t v = 1; v <= n; ++v)
    s.fill((v - 1) * chunk, chunk, v);
  std::atomic<int> ok{0}, bad{0};
  std::promise<void> all;
  std::atomic<uint32_t> left{n};
  for (uint32_t v = 1; v <= n; ++v) {
    auto b = s.write(peer.region, (v - 1) * chunk, chunk, v);
    b.tclass = traffic_class::kv;
    s.be->post(std::move(b), [&](completion c) {
      (c.error ? bad : ok)++;
      if (--left == 0)
        all.set_value();
    });
  }
  REQUIRE(all.get_future().wait_for(120s) == std::future_status::ready);
  CHECK(bad == 0);
  std::pair<uint64_t, uint32_t> got;
  for (int i = 0; i < 500; ++i) {
    got = peer.immediates();
    if (got.first == n)
      break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(got.first == n);
  CHECK(peer.early_immediates() == 0);
  for (uint32_t v = 1; v <= n; ++v)
    CHECK(peer.check((v - 1) * chunk, chunk, v));
  auto* vb = dynamic_cast<verbs_backend*>(s.be.get());
  REQUIRE(vb != nullptr);
  auto lanes = vb->kv_lane_bytes();
  REQUIRE(lanes.size() == 3);
  uint64_t sum = 0;
  for (size_t k = 0; k < lanes.size(); ++k) {
    INFO("KV lane " << k + 1 << " carried " << lanes[k] << " bytes");
    CHECK(lanes[k] > 0);
    sum += lanes[k];
  }
  CHECK(sum == chunk * n);
}

TEST_CASE("a batch larger than the send window is written in parts, "
          "completing once") {
  // 300 writes against transport.max_outstanding = 64: five parts in order,
  // one completion with every byte, the immediate after the last byte.
  const uint64_t size = 4u << 20;
  peer_process peer{size};
  sender s{size};
  REQUIRE(!s.be->connect("peer", peer.details));
  const uint64_t n = 300, len = 4096;
  s.fill(0, n * len, 7);
  batch b;
  for (uint64_t k = 0; k < n; ++k)
    b.writes.push_back({&s.reg, k * len, *peer.region.subrange(k * len, len)});
  b.immediate = 77;
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<completion> got;
  s.be->post(std::move(b), [&](completion c) {
    std::lock_guard<std::mutex> guard{mtx};
    got.push_back(std::move(c));
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> guard{mtx};
    REQUIRE(cv.wait_for(guard, 30s, [&] { return !got.empty(); }));
  }
  std::this_thread::sleep_for(200ms); // a second completion would come now
  std::lock_guard<std::mutex> guard{mtx};
  REQUIRE(got.size() == 1);
  REQUIRE_MESSAGE(!got[0].error, dualpath::config::message_of(got[0].error));
  CHECK(got[0].bytes == n * len);
  CHECK(got[0].failed_ops == 0);
  CHECK(peer.check(0, n * len, 7));
  std::pair<uint64_t, uint32_t> imm;
  for (int i = 0; i < 200; ++i) {
    imm = peer.immediates();
    if (imm.first >= 1)
      break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(imm.first == 1); // one immediate for the whole batch
  CHECK(imm.second == 77);
}

TEST_CASE("bad destinations are refused locally; the peer stays usable") {
  peer_process peer{1 << 20};
  sender s{1 << 20};
  REQUIRE(!s.be->connect("peer", peer.details));
  auto oob = peer.region;
  oob.offset = (1 << 20) - 100;
  oob.length = 4096; // a forged view past the region's end
  batch b1;
  b1.writes.push_back({&s.reg, 0, oob});
  CHECK(code_of(run(*s.be, std::move(b1))) == transport_errc::out_of_bounds);
  auto wrong = *peer.region.subrange(0, 4096);
  wrong.key ^= 0x5a5a;
  batch b2;
  b2.writes.push_back({&s.reg, 0, wrong});
  CHECK(code_of(run(*s.be, std::move(b2))) == transport_errc::wrong_key);
  auto unknown = *peer.region.subrange(0, 4096);
  unknown.region_id += 1000;
  batch b3;
  b3.writes.push_back({&s.reg, 0, unknown});
  CHECK(code_of(run(*s.be, std::move(b3))) == transport_errc::unknown_region);
  auto st = s.be->stats();
  CHECK(st.rejected_out_of_bounds == 1);
  CHECK(st.rejected_wrong_key == 1);
  CHECK(st.rejected_unknown_region == 1);
  CHECK(peer.ask("ZERO 0 " + std::to_string(1 << 20)) == "OK"); // none landed
  s.fill(0, 65536, 7);
  auto c = run(*s.be, s.write(peer.region, 0, 65536, 1));
  CHECK(!c.error);
  CHECK(peer.check(0, 65536, 7));
  CHECK(s.be->stats().connects == 1); // the same connection throughout
}

TEST_CASE("a peer killed mid-transfer fails every pending batch in time") {
  const uint64_t chunk = 1 << 20;
  peer_process peer{64 * chunk};
  sender s{chunk};
  REQUIRE(!s.be->connect("peer", peer.details));
  s.fill(0, chunk, 3);
  const int n = 200;
  const auto deadline = 20s;
  in_flight w{s, peer.region, chunk, n, deadline};
  peer.kill();
  auto killed = clock_type::now();
  auto& done = w.all();
  auto start = w.start;
  size_t failed = 0;
  for (auto& [c, at] : done) {
    CHECK(at <= start + deadline + 1s);
    if (c.error) {
      ++failed;
      CHECK(code_of(c) == transport_errc::peer_lost);
    }
  }
  MESSAGE(failed << " of " << n << " batches failed after the kill");
  CHECK(failed > 0);
  auto last = done.back().second;
  MESSAGE("the last failed "
          << std::chrono::duration_cast<std::chrono::milliseconds>(last
                                                                   - killed)
                 .count()
          << " ms after the kill");
  CHECK(last - killed < 5s);
}

TEST_CASE("a restarted peer is reached again with its new details") {
  sender s{1 << 20};
  auto first = std::make_unique<peer_process>(1 << 20);
  REQUIRE(!s.be->connect("peer", first->details));
  s.fill(0, 8192, 11);
  CHECK(!run(*s.be, s.write(first->region, 0, 8192)).error);
  CHECK(first->check(0, 8192, 11));
  auto old_region = first->region;
  first.reset(); // killed
  // The old connection is gone, its descriptor useless.
  std::this_thread::sleep_for(200ms);
  auto c = run(*s.be, s.write(old_region, 0, 8192));
  CHECK(code_of(c) == transport_errc::peer_lost);
  peer_process second{1 << 20};
  REQUIRE(!s.be->connect("peer", second.details));
  s.fill(0, 8192, 12);
  CHECK(!run(*s.be, s.write(second.region, 0, 8192)).error);
  CHECK(second.check(0, 8192, 12));
  CHECK(s.be->stats().connects == 2);
}

namespace {

/// The sender device's network interface (RoCE: its port's first GID's
/// netdev), read from sysfs; "" when the device has none.
std::string netdev_of(const std::string& device) {
  std::ifstream in{"/sys/class/infiniband/" + device
                   + "/ports/1/gid_attrs/ndevs/0"};
  std::string name;
  in >> name;
  return name;
}

std::string port_state(const std::string& device) {
  std::ifstream in{"/sys/class/infiniband/" + device + "/ports/1/state"};
  std::string text;
  std::getline(in, text);
  return text;
}

/// Takes `netdev` down for its lifetime (`ip link set dev X down`), up again
/// at the end, also when a check fails.
class link_down {
public:
  explicit link_down(std::string netdev) : netdev_(std::move(netdev)) {
    auto r = dualpath::test::run_process(
        {"/sbin/ip", "link", "set", "dev", netdev_, "down"});
    REQUIRE_MESSAGE(r.status == 0, r.err);
  }
  ~link_down() {
    up();
  }
  void up() {
    if (netdev_.empty())
      return;
    dualpath::test::run_process(
        {"/sbin/ip", "link", "set", "dev", netdev_, "up"});
    netdev_.clear();
  }

private:
  std::string netdev_;
};

} // namespace

TEST_CASE("the port going down fails every pending batch; up, it reconnects") {
  const uint64_t chunk = 1 << 20;
  sender s{chunk}; // skips here without a device
  auto device = env_or("DUALPATH_VERBS_DEVICE", "");
  auto netdev = device.empty() ? std::string{} : netdev_of(device);
  if (std::getenv("DUALPATH_VERBS_PORT_DOWN_OK") == nullptr || netdev.empty()) {
    // Taking a host's interface down is for a throw-away guest only.
    MESSAGE("not run: needs DUALPATH_VERBS_PORT_DOWN_OK=1 and "
            "DUALPATH_VERBS_DEVICE naming a RoCE device (tests/rdma/in-guest "
            "sets both)");
    return;
  }
  peer_process peer{64 * chunk};
  REQUIRE(!s.be->connect("peer", peer.details));
  s.fill(0, chunk, 5);
  REQUIRE(!run(*s.be, s.write(peer.region, 0, chunk)).error);
  const int n = 200;
  in_flight w{s, peer.region, chunk, n, 20s};
  link_down down{netdev};
  auto downed = clock_type::now();
  auto& done = w.all();
  size_t failed = 0;
  size_t by_event = 0;
  for (auto& [c, at] : done) {
    if (!c.error)
      continue;
    if (failed == 0)
      MESSAGE("the first failure: " << dualpath::config::message_of(c.error));
    ++failed;
    CHECK(code_of(c) == transport_errc::peer_lost);
    if (dualpath::config::message_of(c.error).find("port error")
        != std::string::npos)
      ++by_event;
  }
  MESSAGE(failed << " of " << n << " batches failed after " << netdev
                 << " went down, " << by_event << " by the port-error event");
  CHECK(failed > 0);
  // Which notice comes first is a race, not a contract: the port-error
  // event on this side, or the peer (whose port went down with the same
  // veth pair) closing the side channel after its own event. Either way
  // every pending batch fails, within seconds.
  CHECK(done.back().second - downed < 5s);
  // Up again: once the port is active, a new connection carries bytes.
  down.up();
  auto until = clock_type::now() + 30s;
  while (port_state(device).find("ACTIVE") == std::string::npos
         && clock_type::now() < until)
    std::this_thread::sleep_for(100ms);
  REQUIRE_MESSAGE(port_state(device).find("ACTIVE") != std::string::npos,
                  port_state(device));
  auto reconnected = s.be->connect("peer", peer.details);
  REQUIRE_MESSAGE(!reconnected, dualpath::config::message_of(reconnected));
  s.fill(0, 8192, 6);
  CHECK(!run(*s.be, s.write(peer.region, 0, 8192)).error);
  CHECK(peer.check(0, 8192, 6));
}

TEST_CASE("100,000 small writes with selective signalling, no CQ overrun") {
  const uint64_t write_bytes = 64;
  const int writes = 100000;
  const int per_batch = 50;
  peer_process peer{write_bytes * writes};
  auto o = verbs_options("sender", env_or("DUALPATH_VERBS_DEVICE", ""));
  o.verbs_max_outstanding = 256;
  o.default_deadline = 120s;
  sender s{write_bytes * writes, o};
  REQUIRE(!s.be->connect("peer", peer.details));
  s.fill(0, write_bytes * writes, 5);
  std::atomic<int> ok{0}, bad{0};
  std::promise<void> all;
  std::atomic<int> left{writes / per_batch};
  for (int k = 0; k < writes / per_batch; ++k) {
    batch b;
    for (int i = 0; i < per_batch; ++i) {
      uint64_t off =
          (uint64_t{static_cast<uint64_t>(k)} * per_batch + i) * write_bytes;
      b.writes.push_back(
          {&s.reg, off, *peer.region.subrange(off, write_bytes)});
    }
    b.immediate = static_cast<uint32_t>(k);
    s.be->post(std::move(b), [&](completion c) {
      (c.error ? bad : ok)++;
      if (--left == 0)
        all.set_value();
    });
  }
  REQUIRE(all.get_future().wait_for(300s) == std::future_status::ready);
  CHECK(bad == 0);
  CHECK(ok == writes / per_batch);
  CHECK(peer.check(0, write_bytes * writes, 5));
  std::pair<uint64_t, uint32_t> got;
  for (int i = 0; i < 500; ++i) {
    got = peer.immediates();
    if (got.first == static_cast<uint64_t>(writes / per_batch))
      break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(got.first == static_cast<uint64_t>(writes / per_batch));
  auto st = s.be->stats();
  CHECK(st.batches_completed == static_cast<uint64_t>(writes / per_batch));
  CHECK(st.peer_lost == 0);
}

TEST_CASE("a stream's completions do not wake the side-channel thread") {
  // The side thread collects its commands under a lock of its own. When it
  // took the backend's lock every poll round, it found it held by the
  // poller (which posts the next writes from the completions, an
  // ibv_post_send that on rxe runs the protocol inline) and was woken at
  // nearly every unlock, only to find the lock taken again: hundreds of
  // wake-ups a second, each an IPI and two context switches.
  const uint64_t chunk = 64 << 10;
  const int slots = 32; // in flight
  const int writes = 640;
  peer_process peer{chunk * slots};
  auto o = verbs_options("sender", env_or("DUALPATH_VERBS_DEVICE", ""));
  o.default_deadline = 120s;
  sender s{chunk * slots, o};
  REQUIRE(!s.be->connect("peer", peer.details));
  s.fill(0, chunk * slots, 11);
  auto side = dualpath::test::tids_named("dp-verbs-side");
  REQUIRE(side.size() == 1);
  const long before = dualpath::test::voluntary_switches(side[0]);
  std::mutex mtx;
  std::condition_variable cv;
  int posted = 0, done = 0, bad = 0;
  std::function<void()> next = [&] {
    int k = 0;
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (posted == writes)
        return;
      k = posted++;
    }
    auto off = static_cast<uint64_t>(k % slots) * chunk;
    s.be->post(s.write(peer.region, off, chunk), [&](completion c) {
      next(); // from the completion, as a stream keeps its window full
      std::lock_guard<std::mutex> guard{mtx};
      bad += c.error ? 1 : 0;
      if (++done == writes)
        cv.notify_all();
    });
  };
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < slots; ++i)
    next();
  {
    std::unique_lock<std::mutex> guard{mtx};
    REQUIRE(cv.wait_for(guard, 300s, [&] { return done == writes; }));
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  const long woken = dualpath::test::voluntary_switches(side[0]) - before;
  CHECK(bad == 0);
  CHECK(peer.check(0, chunk * slots, 11));
  // Its own rhythm: one poll timeout per 200 ms, and a few wake-ups for
  // the connection; not one per completion.
  INFO(writes << " writes in " << ms << " ms; the side thread slept " << woken
              << " times");
  CHECK(woken <= ms / 200 + 10);
}

TEST_CASE("a peer without the shared secret is refused") {
  peer_process peer{1 << 20};
  auto o = verbs_options("sender", env_or("DUALPATH_VERBS_DEVICE", ""));
  o.secret = "not-the-secret";
  sender s{4096, o};
  auto err = s.be->connect("peer", peer.details);
  REQUIRE(err);
  CHECK(static_cast<transport_errc>(err.code())
        == transport_errc::unauthenticated);
  auto c = run(*s.be, s.write(peer.region, 0, 4096));
  CHECK(code_of(c) == transport_errc::peer_lost);
}

TEST_CASE("two backends in one process, each connecting to the other") {
  auto a =
      open_or_skip(verbs_options("a", env_or("DUALPATH_VERBS_DEVICE", "")));
  auto b = open_or_skip(
      verbs_options("b", env_or("DUALPATH_VERBS_PEER_DEVICE", "")));
  std::vector<uint8_t> ma(1 << 20), mb(1 << 20);
  auto ra = a->register_region(ma.data(), ma.size());
  auto rb = b->register_region(mb.data(), mb.size());
  REQUIRE(ra);
  REQUIRE(rb);
  // Both directions at once: each side's connect serves the other's.
  auto fa = std::async(std::launch::async,
                       [&] { return a->connect("b", *b->details_for("a")); });
  auto fb = std::async(std::launch::async,
                       [&] { return b->connect("a", *a->details_for("b")); });
  REQUIRE(!fa.get());
  REQUIRE(!fb.get());
  for (size_t i = 0; i < ma.size(); ++i) {
    ma[i] = pattern(i, 21);
    mb[i] = pattern(i, 22);
  }
  batch ab;
  ab.writes.push_back({&*ra, 0, *rb->describe().subrange(0, 1 << 19)});
  batch ba;
  ba.writes.push_back(
      {&*rb, 1 << 19, *ra->describe().subrange(1 << 19, 1 << 19)});
  CHECK(!run(*a, std::move(ab)).error);
  CHECK(!run(*b, std::move(ba)).error);
  CHECK(std::memcmp(mb.data(), ma.data(), 1 << 19) == 0);
  CHECK(std::memcmp(ma.data() + (1 << 19), mb.data() + (1 << 19), 1 << 19)
        == 0);
  // A region registered after the handshake is found (table refresh).
  std::vector<uint8_t> late(4096);
  auto rl = b->register_region(late.data(), late.size());
  REQUIRE(rl);
  batch al;
  al.writes.push_back({&*ra, 0, *rl->describe().subrange(0, 4096)});
  CHECK(!run(*a, std::move(al)).error);
  CHECK(std::memcmp(late.data(), ma.data(), 4096) == 0);
  // ...and one removed is refused locally, not by the remote device.
  auto gone = rl->describe();
  *rl = local_registration{};
  std::this_thread::sleep_for(100ms);
  batch ag;
  ag.writes.push_back({&*ra, 0, *gone.subrange(0, 4096)});
  CHECK(code_of(run(*a, std::move(ag))) == transport_errc::unknown_region);
  // drop_peer fails what is pending and forgets the peer.
  a->drop_peer("b");
  batch ad;
  ad.writes.push_back({&*ra, 0, *rb->describe().subrange(0, 4096)});
  CHECK(code_of(run(*a, std::move(ad))) == transport_errc::peer_lost);
  *ra = local_registration{};
  *rb = local_registration{};
}
