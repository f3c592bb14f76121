// bench_gpu_copy: what moving Layer Blocks into GPU memory costs.
//
// Workloads (each run `runs` times after `warmups`; median, min and max):
//   submit_per_chunk  61 layers x 64 tokens = 3,904 chunks of 656 B (a ds-660b
//                     Layer Block row each), host -> device, one
//                     cudaMemcpyAsync per chunk: host time to submit, per
//                     chunk, and time until the copies complete.
//   submit_batched    the same list in one cudaMemcpyBatchAsync.
//   h2d_<size>        one contiguous H2D copy from pinned memory (a Layer
//                     Block of 64 tokens, a layer of 4,096 / 32,768 tokens x
//                     656 B, and 256 MiB): GB/s from submission to completion
//                     (event synchronised), and the peer: one plain
//                     cudaMemcpy of the same bytes between the same buffers
//                     (column `peer`, and their ratio).
//   d2h_32k           the 32,768-token layer back, device -> host.
// Every workload's bytes are verified once on the device with the checksum
// kernel against the host reference (column `ok`).
//
// Usage: bench_gpu_copy [--backend cuda|host] [--runs N] [--warmups N]
// Without a CUDA device (and --backend cuda, the default) it prints
// "SKIP gpu_copy: <reason>" and exits 77; a device that cannot be used (a
// driver too old for this runtime), an unusable batch API or a wrong byte
// fails (exit 1). The last line is `RESULT gpu_copy key=value ...`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"

#if DUALPATH_HAVE_CUDA
#  include <cuda_runtime_api.h>
#endif

using namespace dualpath::gpu;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr size_t row_bytes = 656; // ds-660b: FP8 MLA KV per token per layer
constexpr size_t layers = 61;
constexpr size_t tokens_per_chunk_list = 64;

struct stats {
  double median = 0;
  double min = 0;
  double max = 0;
};

stats summarize(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  stats s;
  if (xs.empty())
    return s;
  s.min = xs.front();
  s.max = xs.back();
  const size_t n = xs.size();
  s.median = n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
  return s;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string text_of(const caf::error& err) {
  const auto& ctx = err.context();
  if (ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return caf::to_string(err);
}

[[noreturn]] void fail(const std::string& what, const caf::error& err) {
  std::printf("FAIL gpu_copy: %s: %s\n", what.c_str(), text_of(err).c_str());
  std::printf("RESULT gpu_copy failed=1\n");
  std::exit(1);
}

template <class T>
T take(caf::expected<T>&& x, const std::string& what) {
  if (!x)
    fail(what, x.error());
  return std::move(*x);
}

void check(const caf::error& err, const std::string& what) {
  if (err)
    fail(what, err);
}

struct env {
  std::shared_ptr<device> dev;
  stream s;
  event done;
};

/// Deterministic host bytes.
/// Host bytes the bench pins: whole pages of their own.
using pinnable = std::vector<std::byte, page_allocator<std::byte>>;

void fill(pinnable& buf, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : buf) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x & 0xFF);
  }
}

struct submit_result {
  stats submit_us_per_chunk;
  stats complete_ms;
  bool ok = false;
};

/// The scattered Layer Block rows: chunk i of the host buffer goes to a
/// strided place in device memory (layer-major on the device, token-major on
/// the host), as a layer streamer would lay them out.
submit_result run_submit(env& e, copy_method method, int warmups, int runs) {
  const size_t rows = layers * tokens_per_chunk_list;
  const size_t bytes = rows * row_bytes;
  pinnable host(bytes);
  fill(host, 1);
  auto pin = take(e.dev->pin(host.data(), bytes), "pin");
  auto buf = take(e.dev->allocate(bytes), "allocate");
  std::vector<copy_chunk> chunks;
  chunks.reserve(rows);
  for (size_t t = 0; t < tokens_per_chunk_list; ++t)
    for (size_t l = 0; l < layers; ++l)
      chunks.push_back(copy_chunk{(t * layers + l) * row_bytes,
                                  (l * tokens_per_chunk_list + t) * row_bytes,
                                  row_bytes});
  std::vector<double> submit_us;
  std::vector<double> complete_ms;
  for (int i = 0; i < warmups + runs; ++i) {
    auto t0 = clock_type::now();
    check(e.dev->copy_h2d(pin, buf, chunks, e.s, method), "copy_h2d");
    const double submitted = seconds_since(t0);
    check(e.dev->record(e.done, e.s), "record");
    check(e.dev->synchronize(e.done), "synchronize");
    const double completed = seconds_since(t0);
    if (i >= warmups) {
      submit_us.push_back(submitted * 1e6 / static_cast<double>(rows));
      complete_ms.push_back(completed * 1e3);
    }
  }
  std::vector<std::byte> expect(bytes);
  for (const auto& c : chunks)
    std::memcpy(expect.data() + c.dst_offset, host.data() + c.src_offset,
                c.length);
  auto sum = take(e.dev->checksum(buf, 0, bytes, e.s), "checksum");
  submit_result r;
  r.submit_us_per_chunk = summarize(submit_us);
  r.complete_ms = summarize(complete_ms);
  r.ok = sum == block_checksum(expect.data(), bytes);
  return r;
}

struct bw_result {
  stats gbps;
  stats peer_gbps; ///< One plain cudaMemcpy (0 without CUDA).
  bool ok = false;
};

/// GB/s of one synchronous cudaMemcpy of `bytes` between the same pinned
/// host memory and device memory: the peer of run_bandwidth().
stats plain_memcpy(void* host, std::byte* dev, size_t bytes, bool to_device,
                   int warmups, int runs) {
#if DUALPATH_HAVE_CUDA
  std::vector<double> gbps;
  for (int i = 0; i < warmups + runs; ++i) {
    auto t0 = clock_type::now();
    auto rc = to_device ? cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice)
                        : cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    const double secs = seconds_since(t0);
    if (rc != cudaSuccess) {
      std::printf("FAIL gpu_copy: cudaMemcpy -> %s\n", cudaGetErrorName(rc));
      std::printf("RESULT gpu_copy failed=1\n");
      std::exit(1);
    }
    if (i >= warmups)
      gbps.push_back(static_cast<double>(bytes) / secs / 1e9);
  }
  return summarize(gbps);
#else
  (void)host;
  (void)dev;
  (void)bytes;
  (void)to_device;
  (void)warmups;
  (void)runs;
  return stats{};
#endif
}

bw_result run_bandwidth(env& e, size_t bytes, bool to_device, int warmups,
                        int runs) {
  pinnable host(bytes);
  fill(host, bytes);
  auto pin = take(e.dev->pin(host.data(), bytes), "pin");
  auto buf = take(e.dev->allocate(bytes), "allocate");
  const std::vector<copy_chunk> whole{{0, 0, bytes}};
  const uint64_t expect = block_checksum(host.data(), bytes);
  if (!to_device) {
    // Give the device buffer the bytes to send back, then clear the host
    // copy so that the check below proves the D2H copies wrote it.
    check(e.dev->copy_h2d(pin, buf, whole, e.s), "copy_h2d");
    check(e.dev->synchronize(e.s), "synchronize");
    std::memset(host.data(), 0, bytes);
  }
  std::vector<double> gbps;
  for (int i = 0; i < warmups + runs; ++i) {
    check(e.dev->synchronize(e.s), "synchronize");
    auto t0 = clock_type::now();
    check(to_device ? e.dev->copy_h2d(pin, buf, whole, e.s)
                    : e.dev->copy_d2h(buf, pin, whole, e.s),
          "copy");
    check(e.dev->record(e.done, e.s), "record");
    check(e.dev->synchronize(e.done), "synchronize");
    const double secs = seconds_since(t0);
    if (i >= warmups)
      gbps.push_back(static_cast<double>(bytes) / secs / 1e9);
  }
  bw_result r;
  r.gbps = summarize(gbps);
  if (e.dev->capabilities().kind == backend_kind::cuda) {
    check(e.dev->synchronize(e.s), "synchronize");
    r.peer_gbps =
        plain_memcpy(host.data(), buf.data(), bytes, to_device, warmups, runs);
    if (!to_device) {
      // The check below must see bytes this module's copy wrote, not the
      // peer's.
      std::memset(host.data(), 0, bytes);
      check(e.dev->copy_d2h(buf, pin, whole, e.s), "copy_d2h");
    }
  }
  if (to_device) {
    r.ok = take(e.dev->checksum(buf, 0, bytes, e.s), "checksum") == expect;
  } else {
    check(e.dev->synchronize(e.s), "synchronize");
    r.ok = block_checksum(host.data(), bytes) == expect;
  }
  return r;
}

} // namespace

int main(int argc, char** argv) {
  std::string backend = "cuda";
  int runs = 10;
  int warmups = 2;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc)
      backend = argv[++i];
    else if (arg == "--runs" && i + 1 < argc)
      runs = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--warmups" && i + 1 < argc)
      warmups = std::max(0, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: bench_gpu_copy [--backend cuda|host] [--runs N] "
                   "[--warmups N]\n");
      return 2;
    }
  }
  device_options opts;
  opts.backend = take(parse_backend_choice(backend), "--backend");
  opts.hbm_budget = uint64_t{2} << 30;
  if (opts.backend == backend_choice::cuda) {
    // Skipped only where no device exists; a device that cannot be used
    // (e.g. a driver older than this runtime) is a failure.
    if (auto count = probe_cuda(); !count) {
      if (count.error() != gpu_errc::no_device)
        fail("probe_cuda", count.error());
      std::printf("SKIP gpu_copy: %s\n", text_of(count.error()).c_str());
      std::printf("RESULT gpu_copy skipped=1\n");
      return 77;
    }
  }
  auto sel = take(make_device(opts), "make_device");
  env e{sel.dev, take(sel.dev->make_stream(), "make_stream"),
        take(sel.dev->make_event(), "make_event")};
  const auto& caps = e.dev->capabilities();
  std::printf("gpu_copy: %s\n", sel.reason.c_str());
  std::printf("device: %s, batched_copy=%d, runs=%d, warmups=%d%s%s\n",
              caps.name.c_str(), caps.batched_copy ? 1 : 0, runs, warmups,
              caps.notes.empty() ? "" : ", notes: ", caps.notes.c_str());
  std::printf("\n%-18s %8s %12s %28s %22s %3s\n", "workload", "chunks", "bytes",
              "submit us/chunk med [min,max]", "complete ms med", "ok");
  const size_t rows = layers * tokens_per_chunk_list;
  auto per_chunk = run_submit(e, copy_method::per_chunk, warmups, runs);
  auto print_submit = [&](const char* name, const submit_result& r) {
    std::printf("%-18s %8zu %12zu %10.3f [%6.3f,%7.3f] %15.3f [%5.2f] %3s\n",
                name, rows, rows * row_bytes, r.submit_us_per_chunk.median,
                r.submit_us_per_chunk.min, r.submit_us_per_chunk.max,
                r.complete_ms.median, r.complete_ms.max, r.ok ? "yes" : "NO");
  };
  print_submit("submit_per_chunk", per_chunk);
  submit_result batched;
  bool batch_ok = true;
  if (caps.batched_copy) {
    batched = run_submit(e, copy_method::batched, warmups, runs);
    print_submit("submit_batched", batched);
  } else {
    // A CUDA 13 runtime on a driver that runs it has the batch API: its
    // absence on a real device is a failure of this check.
    batch_ok = caps.kind != backend_kind::cuda;
    std::printf("%-18s unavailable: %s\n", "submit_batched",
                caps.notes.c_str());
  }
  struct bw_case {
    const char* name;
    size_t bytes;
    bool to_device;
  };
  const std::vector<bw_case> cases{
      {"h2d_64tok", 64 * row_bytes, true},
      {"h2d_4ktok", 4096 * row_bytes, true},
      {"h2d_32ktok", 32768 * row_bytes, true},
      {"h2d_256MiB", size_t{256} << 20, true},
      {"d2h_32ktok", 32768 * row_bytes, false},
  };
  std::printf("\n%-18s %12s %30s %30s %6s %3s\n", "workload", "bytes",
              "GB/s med [min,max]", "peer cudaMemcpy GB/s med [min,max]",
              "ratio", "ok");
  std::vector<bw_result> bw;
  bool all_ok = per_chunk.ok && batch_ok && (!caps.batched_copy || batched.ok);
  for (const auto& c : cases) {
    bw.push_back(run_bandwidth(e, c.bytes, c.to_device, warmups, runs));
    const auto& r = bw.back();
    all_ok = all_ok && r.ok;
    std::printf("%-18s %12zu %10.2f [%7.2f,%7.2f] %12.2f [%7.2f,%7.2f] %6.2f "
                "%3s\n",
                c.name, c.bytes, r.gbps.median, r.gbps.min, r.gbps.max,
                r.peer_gbps.median, r.peer_gbps.min, r.peer_gbps.max,
                r.peer_gbps.median > 0 ? r.gbps.median / r.peer_gbps.median
                                       : 0.0,
                r.ok ? "yes" : "NO");
  }
  const double ratio =
      caps.batched_copy && batched.submit_us_per_chunk.median > 0
          ? per_chunk.submit_us_per_chunk.median
                / batched.submit_us_per_chunk.median
          : 0;
  std::printf(
      "\nRESULT gpu_copy backend=%s device=\"%s\" chunks=%zu "
      "chunk_bytes=%zu per_chunk_submit_us=%.3f "
      "batched_submit_us=%.3f submit_ratio=%.2f "
      "per_chunk_complete_ms=%.3f batched_complete_ms=%.3f "
      "h2d_gbps_64tok=%.2f h2d_gbps_4ktok=%.2f h2d_gbps_32ktok=%.2f "
      "h2d_gbps_256MiB=%.2f d2h_gbps_32ktok=%.2f "
      "peer_h2d_gbps_64tok=%.2f peer_h2d_gbps_4ktok=%.2f "
      "peer_h2d_gbps_32ktok=%.2f peer_h2d_gbps_256MiB=%.2f "
      "batch_api=%d verified=%d\n",
      to_string(caps.kind).c_str(), caps.name.c_str(), rows, row_bytes,
      per_chunk.submit_us_per_chunk.median, batched.submit_us_per_chunk.median,
      ratio, per_chunk.complete_ms.median, batched.complete_ms.median,
      bw[0].gbps.median, bw[1].gbps.median, bw[2].gbps.median,
      bw[3].gbps.median, bw[4].gbps.median, bw[0].peer_gbps.median,
      bw[1].peer_gbps.median, bw[2].peer_gbps.median, bw[3].peer_gbps.median,
      caps.batched_copy ? 1 : 0, all_ok ? 1 : 0);
  return all_ok ? 0 : 1;
}
