// bench_transport: throughput of the bulk transport, LevelDB db_bench style:
// the named workloads below, several runs each, median and spread.
//
//   tcp_<size>      the tcp backend between this process and a forked
//                   receiver process on loopback; kv writes of <size> cycling
//                   through a 64 MiB source and a 64 MiB destination region
//                   (every write lands in memory not touched for a while, as
//                   KV blocks do), `window` batches in flight, each later
//                   one posted from an earlier one's completion
//                   (bench::stream_writes).
//   tcp_<size>_hot  the same, every write from and to the same <size> bytes:
//                   the working set of the peers in bench/transport.sh
//                   (iperf3 and ucx_perftest reuse one buffer per side).
//   raw_<size>      no backend: a plain blocking send/recv loop between two
//                   processes with tcp_<size>'s working set (the ceiling of
//                   any TCP transport that copies once per side).
//   local_64m       the local backend copying 64 MiB between two in-process
//                   nodes, against a single-thread memcpy of the same bytes,
//                   alternating, at least 15 pairs per run; the process is
//                   pinned to one CPU for it, so the backend's worker thread
//                   copies on the CPU the memcpy ran on (this VM's two vCPUs
//                   copy at different speeds, docs/benchmarks.md).
//
// Usage: bench_transport [--runs N] [--seconds S] [--only NAME]
//                        [tcp option flags, see bulk_peer.hpp]
// Output: one line per workload:
//   <name> size=<bytes> median_gbps=X min_gbps=Y max_gbps=Z
// (GB/s = 1e9 bytes/s); tcp lines add the CPU seconds per GB moved of the
// sending and the receiving process (medians), local lines memcpy_gbps and
// ratio.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "bench/bulk_peer.hpp"

using namespace dualpath;
using namespace dualpath::transport::bulk;
using clk = std::chrono::steady_clock;

namespace {

using bench::working_set;

struct workload {
  const char* name;
  uint64_t size;
  working_set ws;
};

const workload tcp_workloads[] = {
    {"tcp_64k", 64 << 10, working_set::cycling},
    {"tcp_1m", 1 << 20, working_set::cycling},
    {"tcp_4m", 4 << 20, working_set::cycling},
    {"tcp_1m_hot", 1 << 20, working_set::same_bytes},
    {"tcp_4m_hot", 4 << 20, working_set::same_bytes},
};

const workload raw_workloads[] = {
    {"raw_1m", 1 << 20, working_set::cycling},
    {"raw_4m", 4 << 20, working_set::cycling},
};

constexpr uint64_t region_len = 64 << 20;

double tcp_run(backend& be, const local_registration& src,
               const transport::remote_region& dst, uint64_t size,
               working_set ws, double seconds, int window) {
  auto start = clk::now();
  auto stop = start + std::chrono::duration<double>(seconds);
  auto r = bench::stream_writes(be, src, dst, size, ws, region_len, window,
                                [&] { return clk::now() < stop; });
  double secs = std::chrono::duration<double>(clk::now() - start).count();
  if (!r.failure.empty()) {
    std::fprintf(stderr, "bench_transport: a write failed: %s\n",
                 r.failure.c_str());
    std::exit(1);
  }
  return static_cast<double>(r.bytes) / secs / 1e9;
}

/// One tcp run's rate and CPU cost per GB of both processes.
struct tcp_sample {
  double gbps = 0;
  double tx_cpu_per_gb = 0;
  double rx_cpu_per_gb = 0;
};

tcp_sample tcp_measured(backend& be, const local_registration& src,
                        const transport::remote_region& dst, uint64_t size,
                        working_set ws, double seconds, int window,
                        pid_t rx_pid) {
  auto tx0 = bench::cpu_seconds(::getpid());
  auto rx0 = bench::cpu_seconds(rx_pid);
  auto t0 = clk::now();
  tcp_sample s;
  s.gbps = tcp_run(be, src, dst, size, ws, seconds, window);
  auto gb = s.gbps * std::chrono::duration<double>(clk::now() - t0).count();
  s.tx_cpu_per_gb = (bench::cpu_seconds(::getpid()) - tx0) / gb;
  s.rx_cpu_per_gb = (bench::cpu_seconds(rx_pid) - rx0) / gb;
  return s;
}

/// A child process that accepts plain TCP connections, one after another:
/// each starts with the 8-byte block size, then the receiver recv()s into a
/// 64 MiB region, block after block, until the sender shuts down.
struct raw_receiver {
  pid_t pid = -1;
  uint16_t port = 0;
  ~raw_receiver() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

bool fork_raw_receiver(raw_receiver& out) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&addr), len) != 0
      || ::listen(ls, 4) != 0
      || ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return false;
  out.port = ntohs(addr.sin_port);
  out.pid = ::fork();
  if (out.pid < 0)
    return false;
  if (out.pid > 0) {
    ::close(ls);
    return true;
  }
  std::vector<uint8_t> dst(region_len, 0);
  for (;;) {
    int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0)
      _exit(1);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint64_t block = 0;
    if (::recv(fd, &block, sizeof(block), MSG_WAITALL) != sizeof(block)
        || block == 0 || block > region_len)
      _exit(1);
    uint64_t off = 0;
    for (;;) {
      auto n = ::recv(fd, dst.data() + off, block - off % block, 0);
      if (n <= 0)
        break;
      off += static_cast<uint64_t>(n);
      if (off + block > region_len && off % block == 0)
        off = 0;
    }
    ::close(fd);
  }
}

/// One run of a raw workload: GB/s until the receiver has every byte.
double raw_run(uint16_t port, uint64_t size, double seconds,
               const std::vector<uint8_t>& src) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
      || ::send(fd, &size, sizeof(size), 0) != sizeof(size)) {
    std::fprintf(stderr, "bench_transport: raw peer unreachable\n");
    std::exit(1);
  }
  uint64_t bytes = 0, off = 0;
  auto start = clk::now();
  auto stop = start + std::chrono::duration<double>(seconds);
  while (clk::now() < stop) {
    for (uint64_t done = 0; done < size;) {
      auto n = ::send(fd, src.data() + off + done, size - done, MSG_NOSIGNAL);
      if (n <= 0) {
        std::fprintf(stderr, "bench_transport: raw send failed\n");
        std::exit(1);
      }
      done += static_cast<uint64_t>(n);
    }
    bytes += size;
    off = off + 2 * size > region_len ? 0 : off + size;
  }
  // Done when the receiver has read everything and closed its end.
  ::shutdown(fd, SHUT_WR);
  char c;
  while (::recv(fd, &c, 1, 0) > 0) {
  }
  double secs = std::chrono::duration<double>(clk::now() - start).count();
  ::close(fd);
  return static_cast<double>(bytes) / secs / 1e9;
}

void print(const char* name, uint64_t size, const bench::summary& s,
           const char* extra = "") {
  std::printf("%s size=%llu median_gbps=%.3f min_gbps=%.3f max_gbps=%.3f%s\n",
              name, static_cast<unsigned long long>(size), s.median, s.min,
              s.max, extra);
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  int runs = 5;
  double seconds = 2.0;
  std::string only;
  options o;
  o.secret = "bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--runs")
      runs = std::atoi(argv[i + 1]);
    else if (k == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (k == "--only")
      only = argv[i + 1];
    else if (!bench::tcp_option_flag(k, argv[i + 1], o)) {
      std::fprintf(stderr, "bench_transport: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // Children first, before this process starts threads.
  raw_receiver raw;
  if (!fork_raw_receiver(raw)) {
    std::fprintf(stderr, "bench_transport: cannot start the raw receiver\n");
    return 1;
  }
  bench::receiver_process rx;
  if (!bench::fork_receiver(region_len, o, rx)) {
    std::fprintf(stderr, "bench_transport: cannot start the receiver\n");
    return 1;
  }
  {
    o.node = "sender";
    auto be = make_tcp_backend(o);
    if (!be) {
      std::fprintf(stderr, "bench_transport: %s\n",
                   to_string(be.error()).c_str());
      return 1;
    }
    std::vector<uint8_t> src(region_len, 0x5A);
    auto reg = (*be)->register_region(src.data(), src.size());
    if ((*be)->connect("receiver", {rx.address.begin(), rx.address.end()})) {
      std::fprintf(stderr, "bench_transport: connect failed\n");
      return 1;
    }
    for (auto& w : tcp_workloads) {
      if (!only.empty() && only != w.name)
        continue;
      // Keep about 16 MiB in flight (at least 4 batches), like a stream.
      int window = static_cast<int>(std::max<uint64_t>(4, (16 << 20) / w.size));
      tcp_run(**be, *reg, rx.region, w.size, w.ws, 0.3, window); // warm-up
      std::vector<double> xs, tx, rxc;
      for (int r = 0; r < runs; ++r) {
        auto m = tcp_measured(**be, *reg, rx.region, w.size, w.ws, seconds,
                              window, rx.pid);
        xs.push_back(m.gbps);
        tx.push_back(m.tx_cpu_per_gb);
        rxc.push_back(m.rx_cpu_per_gb);
      }
      char extra[128];
      std::snprintf(extra, sizeof(extra),
                    " tx_cpu_s_per_gb=%.3f rx_cpu_s_per_gb=%.3f",
                    bench::summarize(tx).median, bench::summarize(rxc).median);
      print(w.name, w.size, bench::summarize(xs), extra);
    }
  }
  for (auto& w : raw_workloads) {
    if (!only.empty() && only != w.name)
      continue;
    std::vector<uint8_t> src(region_len, 0x5A);
    raw_run(raw.port, w.size, 0.3, src); // warm-up
    std::vector<double> xs, tx, rxc;
    for (int r = 0; r < runs; ++r) {
      auto tx0 = bench::cpu_seconds(::getpid());
      auto rx0 = bench::cpu_seconds(raw.pid);
      auto t0 = clk::now();
      auto gbps = raw_run(raw.port, w.size, seconds, src);
      auto gb = gbps * std::chrono::duration<double>(clk::now() - t0).count();
      xs.push_back(gbps);
      tx.push_back((bench::cpu_seconds(::getpid()) - tx0) / gb);
      rxc.push_back((bench::cpu_seconds(raw.pid) - rx0) / gb);
    }
    char extra[128];
    std::snprintf(extra, sizeof(extra),
                  " tx_cpu_s_per_gb=%.3f rx_cpu_s_per_gb=%.3f",
                  bench::summarize(tx).median, bench::summarize(rxc).median);
    print(w.name, w.size, bench::summarize(xs), extra);
  }
  if (only.empty() || only == "local_64m") {
    // Pinned before the backends start their worker threads (which inherit
    // the mask); this thread's mask is restored after.
    cpu_set_t all;
    bool pinned = ::sched_getaffinity(0, sizeof(all), &all) == 0
                  && bench::pin_calling_thread(::sched_getcpu());
    const int copies = std::max(runs, 15);
    auto fabric = make_local_fabric();
    options oa, ob;
    oa.node = "a";
    ob.node = "b";
    auto a = make_local_backend(oa, fabric);
    auto b = make_local_backend(ob, fabric);
    std::vector<uint8_t> src(region_len, 0x33), dst(region_len, 0);
    auto rs = (*a)->register_region(src.data(), src.size());
    auto rd = (*b)->register_region(dst.data(), dst.size());
    std::vector<double> ours, base;
    for (int r = 0; r < copies + 1; ++r) {
      auto t0 = clk::now();
      std::memcpy(dst.data(), src.data(), region_len);
      auto t1 = clk::now();
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      batch x;
      x.writes.push_back({&*rs, 0, rd->describe()});
      auto t2 = clk::now();
      (*a)->post(std::move(x), [&](completion) {
        std::lock_guard<std::mutex> g{m};
        done = true;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> g{m};
      cv.wait(g, [&] { return done; });
      auto t3 = clk::now();
      if (r == 0)
        continue; // warm-up
      base.push_back(region_len / std::chrono::duration<double>(t1 - t0).count()
                     / 1e9);
      ours.push_back(region_len / std::chrono::duration<double>(t3 - t2).count()
                     / 1e9);
    }
    auto so = bench::summarize(ours);
    auto sb = bench::summarize(base);
    char extra[128];
    std::snprintf(extra, sizeof(extra), " memcpy_gbps=%.3f ratio=%.3f",
                  sb.median, so.median / sb.median);
    print("local_64m", region_len, so, extra);
    if (pinned)
      ::sched_setaffinity(0, sizeof(all), &all);
  }
  return 0;
}
