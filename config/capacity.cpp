#include "config/capacity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "config/errors.hpp"
#include "config/settings.hpp"

namespace dualpath::config {

namespace {

std::string human_bytes(long double x) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t u = 0;
  while (x >= 1024 && u + 1 < std::size(units)) {
    x /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0Lf %s" : "%.1Lf %s", x,
                units[u]);
  return buf;
}

// The key among `keys` to blame: the first one set explicitly (file,
// profile or override), else the first.
std::string blame(const settings& cfg, std::vector<std::string> keys) {
  for (auto& k : keys)
    if (cfg.source_of(k) == value_source::file
        || cfg.source_of(k) == value_source::override_value)
      return k;
  return keys.front();
}

caf::error too_big(const settings& cfg, const std::string& key,
                   const std::string& what, long double bytes,
                   uint64_t memory) {
  return caf::make_error(
      config_errc::out_of_range,
      "configuration key '" + key + "' = " + to_string(cfg.get(key)) + " ("
          + cfg.describe_source(key) + ") asks for " + what + " of "
          + human_bytes(bytes) + ", more than this process can hold ("
          + human_bytes(static_cast<long double>(memory)) + " of memory)");
}

} // namespace

uint64_t host_memory_bytes() {
  auto pages = ::sysconf(_SC_PHYS_PAGES);
  auto page = ::sysconf(_SC_PAGE_SIZE);
  uint64_t mem = pages > 0 && page > 0 ? static_cast<uint64_t>(pages)
                                             * static_cast<uint64_t>(page)
                                       : std::numeric_limits<uint64_t>::max();
  for (auto res : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit lim{};
    if (::getrlimit(res, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
      mem = std::min<uint64_t>(mem, lim.rlim_cur);
  }
  return mem;
}

caf::error check_capacity(const settings& cfg, uint64_t memory) {
  // Keys the code stores in 32-bit fields (counts of tokens, layers, blocks,
  // nodes, GPUs): larger values would wrap.
  for (auto key :
       {"storage.block_tokens", "storage.prefetch_blocks", "model.layers",
        "model.kv_bytes_per_token_layer", "run.byte_scale", "run.prefill_nodes",
        "run.decode_nodes", "hardware.gpus_per_node", "hardware.snic_per_node",
        "engines.layer_window", "engines.basic_batch_tokens",
        "engines.prefill_ep", "engines.decode_ep", "workload.agents",
        "workload.max_len", "workload.turns", "run.turns"}) {
    auto x = cfg.integer(key);
    if (x > int64_t{std::numeric_limits<int32_t>::max()})
      return caf::make_error(
          config_errc::out_of_range,
          "configuration key '" + std::string{key} + "' = " + std::to_string(x)
              + " (" + cfg.describe_source(key)
              + ") is out of range: allowed at most "
              + std::to_string(std::numeric_limits<int32_t>::max()));
  }
  using real = long double; // exact enough, never overflows
  auto num = [&](const char* key) {
    return static_cast<real>(cfg.integer(key));
  };
  auto mem = static_cast<real>(memory);
  // Real bytes per token and layer: nominal KV bytes over the byte scale
  // (0 = one real byte), as actors/cluster/cluster.cpp sizes copies.
  auto scale = cfg.integer("run.byte_scale") == 0
                   ? num("model.kv_bytes_per_token_layer")
                   : num("run.byte_scale");
  auto per_token_layer =
      std::ceil(num("model.kv_bytes_per_token_layer") / scale);
  // One block file: its 4 KiB header (transport/storage/block_format.hpp)
  // and one Layer Block per layer.
  auto block =
      num("model.layers") * num("storage.block_tokens") * per_token_layer
      + 4096;
  if (block > mem)
    return too_big(
        cfg,
        blame(cfg, {"storage.block_tokens", "model.layers",
                    "model.kv_bytes_per_token_layer", "run.byte_scale"}),
        "one KV block file", block, memory);
  // A node's DRAM buffer (its storage reader's pool): one slot (a block
  // file) per Full Block of hardware.dram_buffer_gib, and at least two of
  // the longest prompts (a decode node keeps one free for reservations), as
  // actors/cluster/cluster.cpp sizes it.
  auto nominal_block = num("model.layers") * num("storage.block_tokens")
                       * num("model.kv_bytes_per_token_layer");
  auto slots =
      std::floor(static_cast<real>(cfg.real("hardware.dram_buffer_gib"))
                 * 1073741824.0L / nominal_block);
  auto longest =
      std::ceil(num("workload.max_len") / num("storage.block_tokens"));
  auto pool = std::max(slots, 2 * longest + 2) * block;
  if (pool > mem)
    return too_big(
        cfg,
        blame(cfg, {"hardware.dram_buffer_gib", "workload.max_len",
                    "storage.block_tokens", "model.layers", "run.byte_scale"}),
        "a node's DRAM buffer", pool, memory);
  auto prefetch = num("storage.prefetch_blocks") * block;
  if (cfg.string("storage.reader") == "prefetching" && prefetch > mem)
    return too_big(cfg, "storage.prefetch_blocks",
                   "the prefetching reader's blocks", prefetch, memory);
  auto frame = num("transport.max_frame_mib") * 1048576;
  if (frame > mem)
    return too_big(cfg, "transport.max_frame_mib", "one bulk frame", frame,
                   memory);
  auto slice = num("transport.slice_kib") * 1024;
  if (slice > mem)
    return too_big(cfg, "transport.slice_kib", "one transfer slice", slice,
                   memory);
  // Every agent's token list, 4 bytes a token, at its longest.
  auto tokens = num("workload.agents") * num("workload.max_len") * 4;
  if (tokens > mem)
    return too_big(cfg, blame(cfg, {"workload.max_len", "workload.agents"}),
                   "the workload's token lists", tokens, memory);
  return caf::none;
}

} // namespace dualpath::config
