// bench_verbs: throughput of the verbs bulk backend between this process and
// a forked receiver process, each on its own RDMA device, LevelDB db_bench
// style: the named workloads below, several runs each, median and spread.
// bench/verbs.sh runs it inside the rdma-vm guest against perftest's
// ib_write_bw on the same device pair.
//
//   verbs_<size>      RDMA WRITEs of <size> cycling through a 64 MiB source
//                     and a 64 MiB destination region, `window` batches in
//                     flight (default: 16 MiB, at least 4; the send queue
//                     256 deep), `bytes` per run.
//   verbs_<size>_hot  the same, every write from and to the same <size>
//                     bytes: the working set of ib_write_bw, which for
//                     messages over half a page posts every write from one
//                     buffer to one remote address.
//
// Devices: $DUALPATH_VERBS_DEVICE (sender), $DUALPATH_VERBS_PEER_DEVICE
// (receiver); empty: the first device.
// Usage: bench_verbs [--runs N] [--bytes B] [--only NAME] [--window W]
//                    [--kv-queue-pairs K]
// (K: the sender's transport.verbs_kv_queue_pairs; default the backend's.)
// Output: one line per workload:
//   <name> size=<bytes> median_gbps=X min_gbps=Y max_gbps=Z window=W
//   kv_queue_pairs=K
// (GB/s = 1e9 bytes/s).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "bench/bulk_peer.hpp"
#include "config/errors.hpp"

using namespace dualpath;
using namespace dualpath::transport::bulk;
using clk = std::chrono::steady_clock;

namespace {

using bench::working_set;

struct workload {
  const char* name;
  uint64_t size;
  working_set set;
};

const workload workloads[] = {
    {"verbs_64k", 64 << 10, working_set::cycling},
    {"verbs_1m", 1 << 20, working_set::cycling},
    {"verbs_4m", 4 << 20, working_set::cycling},
    {"verbs_64k_hot", 64 << 10, working_set::same_bytes},
    {"verbs_1m_hot", 1 << 20, working_set::same_bytes},
    {"verbs_4m_hot", 4 << 20, working_set::same_bytes},
};

constexpr uint64_t region_len = 64 << 20;
const char* secret = "bench";

options verbs_options(const char* node, const char* device_env) {
  options o;
  o.node = node;
  o.secret = secret;
  // A throughput run keeps its window full: deadlines only catch a hang.
  o.default_deadline = std::chrono::seconds{120};
  if (auto d = std::getenv(device_env))
    o.verbs_device = d;
  return o;
}

/// The receiver child: one region, its details on `fd`, then waits.
[[noreturn]] void receiver(int fd) {
  // Not the parent's stdout: whoever reads it waits for its end.
  int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0)
    ::dup2(null, 1);
  auto be = make_verbs_backend(
      verbs_options("receiver", "DUALPATH_VERBS_PEER_DEVICE"));
  if (!be) {
    std::fprintf(stderr, "bench_verbs receiver: %s\n",
                 config::message_of(be.error()).c_str());
    _exit(1);
  }
  std::vector<uint8_t> buf(region_len, 0);
  auto reg = (*be)->register_region(buf.data(), buf.size());
  if (!reg)
    _exit(1);
  auto msg = bench::receiver_line(**be, *reg);
  if (::write(fd, msg.data(), msg.size()) < 0)
    _exit(1);
  for (;;)
    ::pause();
}

/// Writes `count` x `size` bytes with `window` batches in flight; GB/s
/// from the first post to the last completion (-1 if a write failed),
/// every later write posted from an earlier one's completion (as
/// perftest's single loop posts; bench::stream_writes).
double run_once(backend& be, const local_registration& src,
                const transport::remote_region& dst, uint64_t size,
                working_set set, uint64_t count, int window) {
  uint64_t posted = 0;
  auto start = clk::now();
  auto r = bench::stream_writes(be, src, dst, size, set, region_len, window,
                                [&] { return posted++ < count; });
  double secs = std::chrono::duration<double>(clk::now() - start).count();
  if (!r.failure.empty()) {
    std::fprintf(stderr, "bench_verbs: a write failed: %s\n",
                 r.failure.c_str());
    return -1;
  }
  return static_cast<double>(r.bytes) / secs / 1e9;
}

} // namespace

int main(int argc, char** argv) {
  int runs = 5;
  uint64_t total = 96ull << 20;
  int window = 0;
  uint32_t kv_qps = options{}.verbs_kv_queue_pairs;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--runs")
      runs = std::atoi(argv[i + 1]);
    else if (k == "--bytes")
      total = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--only")
      only = argv[i + 1];
    else if (k == "--window")
      window = std::atoi(argv[i + 1]);
    else if (k == "--kv-queue-pairs")
      kv_qps = static_cast<uint32_t>(std::atoi(argv[i + 1]));
  }
  int fds[2];
  if (::pipe(fds) != 0)
    return 1;
  pid_t pid = ::fork(); // before any thread or registration of ours
  if (pid == 0) {
    ::close(fds[0]);
    receiver(fds[1]);
  }
  ::close(fds[1]);
  std::istringstream in{bench::read_line(fds[0])};
  std::string details;
  transport::remote_region dst;
  in >> details >> dst.region_id >> dst.key;
  dst.node = "receiver";
  dst.length = region_len;
  int rc = 0;
  if (details.empty()) {
    std::fprintf(stderr, "bench_verbs: the receiver did not start\n");
    rc = 1;
  } else {
    // The send queue as deep as the window, as ib_write_bw's -t.
    auto o = verbs_options("sender", "DUALPATH_VERBS_DEVICE");
    o.verbs_max_outstanding = 256;
    o.verbs_kv_queue_pairs = kv_qps;
    auto be = make_verbs_backend(o);
    if (!be) {
      std::fprintf(stderr, "bench_verbs: %s\n",
                   config::message_of(be.error()).c_str());
      rc = 1;
    } else {
      std::vector<uint8_t> src(region_len, 0x5A);
      auto reg = (*be)->register_region(src.data(), src.size());
      if (auto err =
              (*be)->connect("receiver", {details.begin(), details.end()})) {
        std::fprintf(stderr, "bench_verbs: connect: %s\n",
                     config::message_of(err).c_str());
        rc = 1;
      }
      for (auto& w : workloads) {
        if (rc != 0 || (!only.empty() && only != w.name))
          continue;
        // As ib_write_bw: about 16 MiB (at least 4 writes) in flight.
        int win =
            window > 0
                ? window
                : static_cast<int>(std::max<uint64_t>(4, (16 << 20) / w.size));
        std::vector<double> xs;
        uint64_t count = std::max<uint64_t>(total / w.size, 1);
        if (run_once(**be, *reg, dst, w.size, w.set,
                     std::max<uint64_t>(count / 8, 4), win)
            < 0) // warm-up
          rc = 1;
        for (int r = 0; r < runs && rc == 0; ++r) {
          xs.push_back(run_once(**be, *reg, dst, w.size, w.set, count, win));
          if (xs.back() < 0)
            rc = 1;
        }
        if (rc != 0)
          continue;
        auto s = bench::summarize(xs);
        std::printf("%s size=%llu median_gbps=%.4f min_gbps=%.4f "
                    "max_gbps=%.4f window=%d kv_queue_pairs=%u\n",
                    w.name, static_cast<unsigned long long>(w.size), s.median,
                    s.min, s.max, win, kv_qps);
        std::fflush(stdout);
      }
    }
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return rc;
}
