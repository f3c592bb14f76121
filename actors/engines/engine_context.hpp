// What an engine actor is given when it is spawned: the emulated node it runs
// on (links, storage reader and its buffer pool, bulk transport, block store),
// the node's GPUs, the model's shape, the loading mode and the actors it talks
// to. The cluster builder (actors/cluster/cluster.hpp) creates one
// node_resources and one engine_config per node; the same structures serve an
// embedded cluster (`dualpath run`), separate processes (`dualpath node`) and
// simulated time.
//
// Ownership: node_resources is shared (shared_ptr) by the actors of a node and
// outlives them; engine_config is copied into the engine.
// Thread safety: node_resources' members are thread-safe objects (links,
// bulk backend, block store) or actor handles.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/engines/emulation.hpp"
#include "actors/engines/load_board.hpp"
#include "actors/observe/hooks.hpp"
#include "actors/protocol/messages.hpp"
#include "actors/protocol/observer_actor.hpp"
#include "actors/protocol/storage_reader_actor.hpp"
#include "gpu/compute_model.hpp"

namespace dualpath::transport::bulk {
class backend;
class local_registration;
} // namespace dualpath::transport::bulk

namespace dualpath::transport::storage {
class block_store;
class buffer_pool;
} // namespace dualpath::transport::storage

namespace dualpath::gpu {
class device;
} // namespace dualpath::gpu

namespace dualpath::actors {

/// How KV is loaded (brief section 4's baselines). A mode is data flow: each
/// engine keeps each path's logic in one place and branches on this once.
enum class load_mode : uint8_t {
  /// PE read path only, the whole prompt KV loaded before prefill, no
  /// layerwise, round-robin placement.
  basic = 0,
  /// PE read path only, layerwise prefill.
  layerwise = 1,
  /// Both read paths, layerwise, the scheduler's policies.
  dualpath = 2,
  /// No storage reads and no transfers: KV assumed resident (zero I/O).
  oracle = 3,
};

std::string to_string(load_mode x);

/// Parses "basic", "layerwise", "dualpath" or "oracle".
bool from_string(const std::string& str, load_mode& x);

/// The model as the engines see it.
struct model_shape {
  uint32_t layers = 0;
  uint32_t block_tokens = 64;
  /// Nominal KV bytes per token per layer (timing uses these).
  uint64_t nominal_bytes_per_token_layer = 0;
  /// Real bytes per token per layer (= ceil(nominal / byte_scale)); the
  /// block store and every real copy use these.
  uint64_t real_bytes_per_token_layer = 0;
  /// Compute model inputs (see gpu/compute_model.hpp).
  double active_params = 0;
  uint32_t attn_heads = 0;
  uint32_t attn_qk_dim = 0;
  uint32_t attn_v_dim = 0;
  /// Sparse attention (0 = dense) and its indexer.
  uint32_t attn_topk = 0;
  uint32_t indexer_heads = 0;
  uint32_t indexer_dim = 0;
  /// Model layers one engine layer stands for: 1 unless a simulation
  /// coarsened the model (coarsen(), `sim.layers_per_step`); the compute
  /// model then charges each engine layer this many model layers.
  double layer_weight = 1;
};

/// `m` with every `k` consecutive layers taken as one step (k >= 1): the
/// layers become ceil(layers / k) steps of equal size, each standing for
/// layers / steps model layers (layer_weight) with that many times the KV
/// bytes per token (nominal rounded to the byte, real = ceil(nominal /
/// byte_scale)), so the KV of a token over the whole model and the compute
/// of a batch are unchanged while the per-layer protocol runs 1/k as often.
/// Only for a modeled data plane: KV content is a function of the real
/// layer, so coarsened engines cannot verify bytes. k = 1 returns `m`.
model_shape coarsen(const model_shape& m, uint32_t k, uint32_t byte_scale);

/// Whether an engine of `sys` waits for device work in place instead of
/// taking the device's completion notice as a message: true under CAF's
/// deterministic scheduler (simulated time), which must not be handed
/// messages from another thread. Real-time systems never wait in place.
bool waits_for_device_in_place(caf::actor_system& sys);

/// One emulated node.
struct node_resources {
  std::string name;
  engine_role role = engine_role::prefill;
  /// The node's storage NIC (also used by its storage reader).
  link_ptr snic;
  /// The node's DRAM (half duplex).
  link_ptr dram;
  /// One compute NIC per GPU, receive and transmit directions.
  std::vector<link_ptr> cnic_rx;
  std::vector<link_ptr> cnic_tx;
  /// The node's bulk transport endpoint (local backend in an embedded
  /// cluster). Regions of the node (reader buffer pool, decode buffers,
  /// GPU memory) are registered with it once.
  std::shared_ptr<transport::bulk::backend> bulk;
  /// The node's storage reader (one per storage NIC; first one here).
  storage_reader_actor reader;
  /// The shared block store (all nodes see the same storage).
  std::shared_ptr<transport::storage::block_store> store;
  /// The node's storage read queue as the reader last published it, read by
  /// the node's engine at each fetch/report tick. Null: it asks the reader.
  std::shared_ptr<load_board> loads;
  /// The node's DRAM buffer (the storage reader's pool: reads land in it,
  /// the decode engine reserves room in it through the reader) and its
  /// registration with the bulk transport (the source and destination of
  /// the node's KV writes). Both outlive the node's actors.
  std::shared_ptr<transport::storage::buffer_pool> pool;
  const transport::bulk::local_registration* pool_registration = nullptr;
};

using node_ptr = std::shared_ptr<node_resources>;

/// What an engine counts as it works (optional; shared with tests and
/// observers, readable from any thread).
struct engine_stats {
  /// Steps of the node's GPUs (prefill steps, or decode steps).
  std::atomic<uint64_t> steps{0};
  /// Prefill: chunks computed (one request's part of one step).
  std::atomic<uint64_t> chunks{0};
  /// Prefill: requests computed in more than one chunk.
  std::atomic<uint64_t> chunked{0};
  /// The most chunks (prefill) or sequences (decode) one GPU had in a step.
  std::atomic<uint64_t> max_batch{0};
  /// Decode: sequence steps (one token each).
  std::atomic<uint64_t> tokens{0};

  void batch(uint64_t n) {
    auto cur = max_batch.load();
    while (n > cur && !max_batch.compare_exchange_weak(cur, n)) {
      // retry with the value another thread wrote
    }
  }
};

/// How a prefill GPU's batch is packed at each step.
enum class batching : uint8_t {
  /// The scheduler's intra-engine compute quota (brief 3): FIFO while the
  /// predicted attention time fits quota_s; the request that overflows is
  /// cut by binary search (scheduler/compute_quota.hpp) and prefilled in
  /// chunks.
  quota = 0,
  /// Without the scheduler (basic, layerwise, dualpath-rr): FIFO up to
  /// batch_tokens new tokens, the last request chunked to fill them.
  token_budget = 1,
};

std::string to_string(batching x);

/// Everything the engine of one node needs (a prefill or decode engine drives
/// every GPU of its node: one expert-parallel group, each GPU one engine to
/// the scheduler, engine_id{node, role, rank}).
struct engine_config {
  engine_role role = engine_role::prefill;
  /// The node's group index within its role (the scheduler's group id).
  uint32_t group = 0;
  /// GPUs of the node (the group's engines, ranks 0 .. gpus - 1).
  uint32_t gpus = 1;
  load_mode mode = load_mode::dualpath;
  batching packing = batching::quota;
  /// Prefill: layers resident in GPU memory at once during layerwise
  /// prefill (Basic keeps every layer resident).
  uint32_t layer_window = 2;
  model_shape model;
  emulated_time time;
  uint32_t byte_scale = 1;
  node_ptr node;
  /// One device per GPU of the node (index = rank).
  std::vector<std::shared_ptr<gpu::device>> devices;
  /// One GPU's peak rate and efficiencies (gpu/compute_model.hpp).
  gpu::gpu_rate gpu;
  /// The group step model: prefill efficiency curve, routed-expert share,
  /// per-layer overhead, weight bytes one GPU holds.
  gpu::group_params group_model;
  /// Nominal HBM bytes per GPU for KV: HBM - weights per GPU - activation
  /// reserve.
  uint64_t hbm_kv_bytes = 0;
  /// batching::quota: attention seconds one GPU's batch may take.
  double quota_s = 0.3;
  /// batching::token_budget: new tokens one GPU's batch may take.
  uint32_t batch_tokens = 16384;
  /// How often the engine fetches work (prefill) or reports (decode), ns.
  int64_t fetch_period_ns = 10'000'000;
  /// Whether the decode engine verifies the prompt KV byte for byte; false
  /// when the data plane is modeled (`dualpath sim`: no byte moves, so
  /// blocks_verified stays 0).
  bool verify_kv = true;
  /// Whether KV bytes are produced, copied and persisted for real; false
  /// when the data plane is modeled (`dualpath sim`): engines skip every
  /// fill, memcpy and device copy and persist blocks without source bytes.
  /// Link, storage-NIC and compute times are the same either way.
  bool real_bytes = true;
  /// Prefill: move the PE-side hit blocks from the node's buffer into GPU
  /// memory as loopback writes of the bulk transport (kv class) instead of a
  /// local copy (CNIC-centric H2D, brief 2.3; `gpu.h2d_via_transport`).
  bool h2d_via_transport = false;
  /// Where fetches, reports, results and failures go.
  caf::actor scheduler;
  /// Optional: receives snapshots and events.
  observer_actor observer;
  /// Optional (null: not observed): timeline spans and metrics.
  observe::hooks_ptr hooks;
  /// Optional: what the engine counts.
  std::shared_ptr<engine_stats> stats;

  /// The engine (GPU) `rank` of this node.
  engine_id id_of(uint32_t rank) const {
    return engine_id{node ? node->name : std::string{}, role, rank};
  }
  /// Optional: lines for the operator (e.g. that GPU memory is staged
  /// through host memory for RDMA); the sink prints each distinct line once.
  std::function<void(const std::string&)> notice;
};

} // namespace dualpath::actors
