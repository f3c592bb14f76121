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
// Output: one line per workload:
//   <name> size=<bytes> median_gbps=X min_gbps=Y max_gbps=Z
// (GB/s = 1e9 bytes/s), and for local also memcpy_gbps and ratio.
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

double tcp_run(backend& be, const local_registration& src,
               const transport::remote_region& dst, uint64_t size,
               double seconds, int window) {
  std::mutex mtx;
  std::condition_variable cv;
  int inflight = 0;
  uint64_t bytes = 0;
  bool failed = false;
  uint64_t slots = region_len / size;
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
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--runs")
      runs = std::atoi(argv[i + 1]);
    else if (k == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (k == "--only")
      only = argv[i + 1];
  }
  const std::string secret = "bench";
  bench::receiver_process rx;
  if (!bench::fork_receiver(region_len, secret, rx)) {
    std::fprintf(stderr, "bench_transport: cannot start the receiver\n");
    return 1;
  }
  {
    options o;
    o.node = "sender";
    o.secret = secret;
    if (auto nice = std::getenv("DUALPATH_KV_RX_NICE"))
      o.kv_rx_nice = std::atoi(nice);
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
      std::vector<double> xs;
      for (int r = 0; r < runs; ++r)
        xs.push_back(tcp_run(**be, *reg, rx.region, w.size, seconds, window));
      print(w.name, w.size, bench::summarize(xs));
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
