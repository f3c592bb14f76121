// bench_storage: Full Block read throughput of the storage backends, the
// reader side of `bench/run storage` (bench/storage.sh runs fio on the same
// files alongside and computes the ratio).
//
//   bench_storage prepare DIR            write the block stores of every
//                                        workload, print one line per workload:
//                                        "<name> <block file bytes> <files>"
//   bench_storage read DIR NAME MODE QD BYTES
//                                        read whole block files of workload
//                                        NAME round-robin, QD in flight, MODE
//                                        direct|buffered, until BYTES were
//                                        read; prints "GBps=<x>" (1e9 bytes/s)
//   bench_storage verify DIR NAME        checksum-verification throughput of
//                                        one core over the workload's blocks
//
// Reads go through the storage_backend (io_uring, or pread if io_uring is
// unavailable) exactly as the block store issues them: one read of the whole
// file (header + padded payload) per block, into an aligned buffer.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transport/storage/block_store.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::storage;

namespace {

// The workloads: 64-token Full Blocks of realistic KV geometries, and how many
// distinct block files each store holds (kept small for /tmp: about 120 MiB
// and 256 MiB).
struct workload {
  const char* name;
  kv_geometry geo;
  uint32_t files;
};

const workload workloads[] = {
    // DeepSeek-V3/660B-like MLA KV: 61 layers x 656 B per token (~2.5 MiB).
    {"ds660b", kv_geometry{61, 64, 656}, 48},
    // Qwen-32B-like GQA KV: 64 layers x 4096 B per token (16 MiB).
    {"qwen32b", kv_geometry{64, 64, 4096}, 16},
};

const workload* find(const std::string& name) {
  for (auto& w : workloads)
    if (name == w.name)
      return &w;
  return nullptr;
}

std::vector<block_hash> hashes_of(const workload& w) {
  std::vector<uint32_t> tokens(size_t{w.files} * w.geo.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  return block_hashes(tokens, w.geo.block_tokens);
}

std::unique_ptr<block_store> open(const std::string& dir, const workload& w,
                                  io_mode mode, uint32_t qd) {
  auto backend = make_backend(backend_config{backend_kind::automatic, qd});
  if (!backend) {
    std::fprintf(stderr, "backend: %s\n", to_string(backend.error()).c_str());
    std::exit(1);
  }
  auto store = block_store::open(
      store_config{dir + "/" + w.name, w.name, w.geo, mode}, *backend);
  if (!store) {
    std::fprintf(stderr, "store: %s\n", to_string(store.error()).c_str());
    std::exit(1);
  }
  return std::move(*store);
}

int prepare(const std::string& dir) {
  if (auto err = posix_make_dir(dir)) {
    std::fprintf(stderr, "%s\n", to_string(err).c_str());
    return 1;
  }
  for (auto& w : workloads) {
    auto store = open(dir, w, io_mode::buffered, 1);
    auto parent = root_hash;
    std::string files;
    for (auto h : hashes_of(w)) {
      if (!store->contains(h))
        if (auto err = store->write_generated(h, parent)) {
          std::fprintf(stderr, "%s\n", to_string(err).c_str());
          return 1;
        }
      files += (files.empty() ? "" : ":") + store->path_of(h);
      parent = h;
    }
    std::printf("%s %llu %s\n", w.name,
                static_cast<unsigned long long>(w.geo.file_bytes()),
                files.c_str());
  }
  return 0;
}

int read_bench(const std::string& dir, const workload& w, io_mode mode,
               uint32_t qd, uint64_t bytes) {
  auto store = open(dir, w, mode, qd);
  auto hashes = hashes_of(w);
  auto file = w.geo.file_bytes();
  // One buffer per in-flight read, as fio allocates iodepth x bs.
  std::vector<aligned_buffer> bufs;
  for (uint32_t i = 0; i < qd; ++i)
    bufs.push_back(std::move(*aligned_buffer::make(file)));
  auto n = (bytes + file - 1) / file;
  std::vector<read_op> ops;
  for (uint64_t i = 0; i < n; ++i)
    ops.push_back(read_op{store->path_of(hashes[i % hashes.size()]), 0,
                          bufs[i % qd].data(), file});
  auto t0 = std::chrono::steady_clock::now();
  auto res = store->backend().read(ops, mode);
  auto secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  uint64_t done = 0;
  for (auto& r : res) {
    if (!r) {
      std::fprintf(stderr, "read: %s\n", to_string(r.error()).c_str());
      return 1;
    }
    done += *r;
  }
  std::printf("backend=%s GBps=%.4f bytes=%llu secs=%.4f\n",
              store->backend().name().c_str(), done / secs / 1e9,
              static_cast<unsigned long long>(done), secs);
  return 0;
}

int verify_bench(const std::string& dir, const workload& w) {
  auto store = open(dir, w, io_mode::buffered, 1);
  auto buf = aligned_buffer::make(w.geo.file_bytes());
  auto hashes = hashes_of(w);
  if (!store->read_full(hashes[0], buf->data())) {
    std::fprintf(stderr, "first block does not verify\n");
    return 1;
  }
  auto hdr = decode_header(buf->data(), header_bytes);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{300})
    for (uint32_t l = 0; l < w.geo.layers; ++l) {
      if (verify_layer(*hdr, w.geo, l, buf->data() + w.geo.layer_offset(l)))
        return 1;
      bytes += w.geo.layer_bytes();
    }
  auto secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("verify GBps=%.4f\n", bytes / secs / 1e9);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_storage prepare DIR\n"
               "       bench_storage read DIR NAME direct|buffered QD BYTES\n"
               "       bench_storage verify DIR NAME\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "prepare")
    return prepare(args[1]);
  if (args.size() == 6 && args[0] == "read") {
    auto w = find(args[2]);
    if (!w || (args[3] != "direct" && args[3] != "buffered"))
      return usage();
    return read_bench(
        args[1], *w, args[3] == "direct" ? io_mode::direct : io_mode::buffered,
        static_cast<uint32_t>(std::stoul(args[4])), std::stoull(args[5]));
  }
  if (args.size() == 3 && args[0] == "verify") {
    auto w = find(args[2]);
    if (!w)
      return usage();
    return verify_bench(args[1], *w);
  }
  return usage();
}
