// bench_transport: throughput of the bulk transport, LevelDB db_bench style:
// the named workloads below, several runs each, median and spread.
//
//   tcp_<size>   the tcp backend between this process and a forked receiver
//                process on loopback; writes of <size> into a 64 MiB region,
//                `window` batches in flight, for `seconds` per run.
//   local_64m    the local backend copying 64 MiB between two in-process
//                nodes, against a single-thread memcpy of the same bytes.
//
// Usage: bench_transport [--runs N] [--seconds S] [--only NAME]
//                        [tcp option flags, see bulk_peer.hpp]
// Output: one line per workload:
//   <name> size=<bytes> median_gbps=X min_gbps=Y max_gbps=Z
// (GB/s = 1e9 bytes/s); tcp lines add the CPU seconds per GB moved of the
// sending and the receiving process (medians), local lines memcpy_gbps and
// ratio.
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

struct workload {
  const char* name;
  uint64_t size;
};

const workload tcp_workloads[] = {
    {"tcp_64k", 64 << 10},
    {"tcp_1m", 1 << 20},
    {"tcp_4m", 4 << 20},
};

constexpr uint64_t region_len = 64 << 20;
/// Bytes of the tcp regions the writes cycle through (--tcp-region-mib).
uint64_t tcp_region_len = region_len;

double tcp_run(backend& be, const local_registration& src,
               const transport::remote_region& dst, uint64_t size,
               double seconds, int window) {
  std::mutex mtx;
  std::condition_variable cv;
  int inflight = 0;
  uint64_t bytes = 0;
  bool failed = false;
  uint64_t slots = std::max<uint64_t>(tcp_region_len / size, 1);
  uint64_t next = 0;
  auto start = clk::now();
  auto stop = start + std::chrono::duration<double>(seconds);
  std::unique_lock<std::mutex> guard{mtx};
  while (clk::now() < stop && !failed) {
    cv.wait(guard, [&] { return inflight < window; });
    ++inflight;
    batch b;
    b.tclass = transport::traffic_class::kv;
    auto off = (next++ % slots) * size;
    b.writes.push_back({&src, off, *dst.subrange(off, size)});
    guard.unlock();
    be.post(std::move(b), [&](completion c) {
      std::lock_guard<std::mutex> g{mtx};
      --inflight;
      if (c.error)
        failed = true;
      else
        bytes += c.bytes;
      cv.notify_all();
    });
    guard.lock();
  }
  cv.wait(guard, [&] { return inflight == 0; });
  double secs = std::chrono::duration<double>(clk::now() - start).count();
  if (failed) {
    std::fprintf(stderr, "bench_transport: a write failed\n");
    std::exit(1);
  }
  return static_cast<double>(bytes) / secs / 1e9;
}

/// One tcp run's rate and CPU cost per GB of both processes.
struct tcp_sample {
  double gbps = 0;
  double tx_cpu_per_gb = 0;
  double rx_cpu_per_gb = 0;
};

tcp_sample tcp_measured(backend& be, const local_registration& src,
                        const transport::remote_region& dst, uint64_t size,
                        double seconds, int window, pid_t rx_pid) {
  auto tx0 = bench::cpu_seconds(::getpid());
  auto rx0 = bench::cpu_seconds(rx_pid);
  auto t0 = clk::now();
  tcp_sample s;
  s.gbps = tcp_run(be, src, dst, size, seconds, window);
  auto gb = s.gbps * std::chrono::duration<double>(clk::now() - t0).count();
  s.tx_cpu_per_gb = (bench::cpu_seconds(::getpid()) - tx0) / gb;
  s.rx_cpu_per_gb = (bench::cpu_seconds(rx_pid) - rx0) / gb;
  return s;
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
    else if (k == "--tcp-region-mib")
      tcp_region_len = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    else if (!bench::tcp_option_flag(k, argv[i + 1], o)) {
      std::fprintf(stderr, "bench_transport: unknown option %s\n", k.c_str());
      return 2;
    }
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
      tcp_run(**be, *reg, rx.region, w.size, 0.3, window); // warm-up
      std::vector<double> xs, tx, rxc;
      for (int r = 0; r < runs; ++r) {
        auto m = tcp_measured(**be, *reg, rx.region, w.size, seconds, window,
                              rx.pid);
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
  if (only.empty() || only == "local_64m") {
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
    for (int r = 0; r < runs + 1; ++r) {
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
  }
  return 0;
}
