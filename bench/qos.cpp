// bench_qos: does bulk kv traffic delay latency-sensitive control writes on
// the same connection pair? LevelDB db_bench style, several runs, median and
// spread.
//
//   control_alone   4 KiB control writes, one at a time, to a receiver
//                   process on loopback (tcp backend, default settings)
//   control_loaded  the same while a kv stream (4 MiB writes, 4 in flight)
//                   saturates the same sender/receiver pair
// Each run alternates alone and loaded twice (half the samples each time).
// The control path runs on one CPU (`transport.tcp_control_cpu`, here
// `--control-cpu`, default 0, in both processes, and this process's posting
// thread with it), as a deployment that wants control latency under a kv
// load configures it; `--control-cpu -1` lets the kernel place the threads.
//
// Usage: bench_qos [--runs N] [--samples N] [--control-cpu N] [tcp option
//                  flags, see bulk_peer.hpp]
// Output per run: p50/p99 of both, then the medians and
//   RESULT qos runs=N p99_ratio=X ratio_spread=A..B alone_p99_us=..
//     loaded_p99_us=.. control_cpu=C   (X: median over runs of loaded p99 /
//                         alone p99, A..B its min..max; target X <= 1.2)
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "bench/bulk_peer.hpp"

using namespace dualpath;
using namespace dualpath::transport::bulk;
using clk = std::chrono::steady_clock;

namespace {

constexpr uint64_t region_len = 64 << 20;
constexpr uint64_t control_size = 4096;
constexpr uint64_t kv_size = 4 << 20;

/// Latencies (microseconds) of `n` sequential control writes.
std::vector<double> control_latencies(backend& be,
                                      const local_registration& src,
                                      const transport::remote_region& dst,
                                      int n) {
  std::vector<double> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::promise<completion> p;
    auto f = p.get_future();
    batch b;
    b.tclass = transport::traffic_class::control;
    auto off = (i % 256) * control_size;
    b.writes.push_back({&src, off, *dst.subrange(off, control_size)});
    auto t0 = clk::now();
    be.post(std::move(b), [&](completion c) { p.set_value(std::move(c)); });
    auto c = f.get();
    auto t1 = clk::now();
    if (c.error) {
      std::fprintf(stderr, "bench_qos: control write failed\n");
      std::exit(1);
    }
    out.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return out;
}

double percentile(std::vector<double> xs, double q) {
  std::sort(xs.begin(), xs.end());
  auto i = static_cast<size_t>(q * static_cast<double>(xs.size() - 1));
  return xs[i];
}

/// Keeps `window` kv writes in flight until stopped; returns GB/s.
class kv_stream {
public:
  kv_stream(backend& be, const local_registration& src,
            const transport::remote_region& dst)
      : be_(be), src_(src), dst_(dst) {
    start_ = clk::now();
    for (int i = 0; i < 4; ++i)
      post_one();
  }
  double stop() {
    std::unique_lock<std::mutex> g{m_};
    stop_ = true;
    cv_.wait(g, [&] { return inflight_ == 0; });
    return bytes_ / std::chrono::duration<double>(clk::now() - start_).count()
           / 1e9;
  }

private:
  void post_one() {
    batch b;
    b.tclass = transport::traffic_class::kv;
    auto off = control_size * 256 + (next_++ % 8) * kv_size;
    b.writes.push_back({&src_, off, *dst_.subrange(off, kv_size)});
    {
      std::lock_guard<std::mutex> g{m_};
      ++inflight_;
    }
    be_.post(std::move(b), [this](completion c) {
      bool again;
      {
        std::lock_guard<std::mutex> g{m_};
        --inflight_;
        bytes_ += c.bytes;
        again = !stop_ && !c.error;
        cv_.notify_all();
      }
      if (again)
        post_one();
    });
  }

  backend& be_;
  const local_registration& src_;
  transport::remote_region dst_;
  std::mutex m_;
  std::condition_variable cv_;
  int inflight_ = 0;
  double bytes_ = 0;
  bool stop_ = false;
  uint64_t next_ = 0;
  clk::time_point start_;
};

} // namespace

int main(int argc, char** argv) {
  int runs = 5;
  int samples = 2000;
  options o;
  o.secret = "qos";
  o.tcp_control_cpu = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--runs")
      runs = std::atoi(argv[i + 1]);
    else if (k == "--samples")
      samples = std::atoi(argv[i + 1]);
    else if (!bench::tcp_option_flag(k, argv[i + 1], o)) {
      std::fprintf(stderr, "bench_qos: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  bench::receiver_process rx;
  if (!bench::fork_receiver(region_len, o, rx)) {
    std::fprintf(stderr, "bench_qos: cannot start the receiver\n");
    return 1;
  }
  o.node = "sender";
  auto be = make_tcp_backend(o);
  if (!be) {
    std::fprintf(stderr, "bench_qos: %s\n", to_string(be.error()).c_str());
    return 1;
  }
  std::vector<uint8_t> src(region_len, 0x42);
  auto reg = (*be)->register_region(src.data(), src.size());
  if ((*be)->connect("receiver", {rx.address.begin(), rx.address.end()})) {
    std::fprintf(stderr, "bench_qos: connect failed\n");
    return 1;
  }
  if (o.tcp_control_cpu >= 0) {
    // The posting thread is the control path's first link. Pinned after the
    // backend started its threads, so its kv threads keep every CPU.
    if (!bench::pin_calling_thread(o.tcp_control_cpu)) {
      std::fprintf(stderr, "bench_qos: cannot run on CPU %d (--control-cpu)\n",
                   o.tcp_control_cpu);
      return 1;
    }
  }
  control_latencies(**be, *reg, rx.region, 500); // warm-up
  std::vector<double> alone99, loaded99, ratios;
  for (int r = 0; r < runs; ++r) {
    // Alone and loaded alternate in `phases` halves, so a change of the
    // machine's other load during a run touches both sides alike.
    constexpr int phases = 2;
    std::vector<double> alone, loaded;
    double gbps = 0;
    for (int ph = 0; ph < phases; ++ph) {
      auto a = control_latencies(**be, *reg, rx.region, samples / phases);
      alone.insert(alone.end(), a.begin(), a.end());
      kv_stream kv{**be, *reg, rx.region};
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto l = control_latencies(**be, *reg, rx.region, samples / phases);
      loaded.insert(loaded.end(), l.begin(), l.end());
      gbps += kv.stop() / phases;
    }
    auto a99 = percentile(alone, 0.99);
    auto l99 = percentile(loaded, 0.99);
    std::printf("run %d: control_alone p50_us=%.1f p99_us=%.1f  "
                "control_loaded p50_us=%.1f p99_us=%.1f  kv_gbps=%.2f  "
                "ratio=%.3f\n",
                r, percentile(alone, 0.5), a99, percentile(loaded, 0.5), l99,
                gbps, l99 / a99);
    std::fflush(stdout);
    alone99.push_back(a99);
    loaded99.push_back(l99);
    ratios.push_back(l99 / a99);
  }
  auto sa = bench::summarize(alone99);
  auto sl = bench::summarize(loaded99);
  auto sr = bench::summarize(ratios);
  std::printf("control_alone p99_us median=%.1f min=%.1f max=%.1f\n", sa.median,
              sa.min, sa.max);
  std::printf("control_loaded p99_us median=%.1f min=%.1f max=%.1f\n",
              sl.median, sl.min, sl.max);
  std::printf("p99_ratio median=%.3f min=%.3f max=%.3f\n", sr.median, sr.min,
              sr.max);
  std::printf("RESULT qos runs=%d p99_ratio=%.3f ratio_spread=%.3f..%.3f "
              "alone_p99_us=%.1f loaded_p99_us=%.1f control_cpu=%d\n",
              runs, sr.median, sr.min, sr.max, sa.median, sl.median,
              o.tcp_control_cpu);
  return 0;
}
