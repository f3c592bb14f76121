// What an engine actor is given when it is spawned: the emulated node it runs
// on (links, storage reader, bulk transport, block store), its GPU, the model's
// shape, the loading mode and the actors it talks to. The cluster builder
// (actors/cluster/cluster.hpp) creates one node_resources per node and one
// engine_config per engine; the same structures serve an embedded cluster
// (`dualpath run`), separate processes (`dualpath node`) and simulated time.
//
// Ownership: node_resources is shared (shared_ptr) by the actors of a node and
// outlives them; engine_config is copied into the engine.
// Thread safety: node_resources' members are thread-safe objects (links,
// bulk backend, block store) or actor handles.
#pragma once

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

namespace dualpath::transport::bulk {
class backend;
} // namespace dualpath::transport::bulk

namespace dualpath::transport::storage {
class block_store;
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
  /// The loads of the node's engines and its read queue, read by the group
  /// leader at each tick. Null: the leader asks every member by message.
  std::shared_ptr<load_board> loads;
};

using node_ptr = std::shared_ptr<node_resources>;

/// Everything one engine needs.
struct engine_config {
  engine_id id;
  uint32_t group = 0;
  load_mode mode = load_mode::dualpath;
  /// Layers resident in GPU memory at once during layerwise prefill.
  uint32_t layer_window = 2;
  /// Prefill: jobs started (reads, admission) ahead of the oldest
  /// unfinished one.
  uint32_t prefill_lookahead = 6;
  model_shape model;
  emulated_time time;
  uint32_t byte_scale = 1;
  node_ptr node;
  /// This engine's GPU (index `id.rank` of the node): a CUDA device or host
  /// memory standing in for HBM; its pool holds the engine's whole budget
  /// as one slab on a real data plane.
  std::shared_ptr<gpu::device> device;
  /// Peak dense FLOP/s times efficiency of one GPU.
  double gpu_flops = 0;
  /// HBM bytes (nominal) this engine may use for KV.
  uint64_t hbm_bytes = 0;
  /// HBM bandwidth of one GPU in bytes/s (decode steps are bound by the
  /// slower of compute and HBM traffic); 0 = compute-bound decode model.
  double hbm_bandwidth = 0;
  /// DRAM buffer bytes (nominal) for decode buffers (decode engines).
  uint64_t dram_buffer_bytes = 0;
  /// Leader only: how often the group leader fetches work (ns).
  int64_t fetch_period_ns = 10'000'000;
  /// The other members of this engine's group in rank order 1..n-1 (filled
  /// for the leader, rank 0, only; the leader itself is not listed).
  std::vector<caf::actor> group_members;
  /// Set on the group leader (rank 0) even when it has no other member
  /// (one GPU per node): it fetches or reports for its group.
  bool group_leader = false;
  /// Whether the decode engine verifies the prompt KV byte for byte; false
  /// when the data plane is modeled (`dualpath sim`: no byte moves, so
  /// blocks_verified stays 0).
  bool verify_kv = true;
  /// Whether KV bytes are produced, copied and persisted for real; false
  /// when the data plane is modeled (`dualpath sim`): engines skip every
  /// fill, memcpy and device copy and persist blocks without source bytes.
  /// Link, storage-NIC and compute times are the same either way.
  bool real_bytes = true;
  /// Where results and fetches go.
  caf::actor scheduler;
  /// Optional: receives snapshots and events.
  observer_actor observer;
  /// Optional (null: not observed): timeline spans and metrics.
  observe::hooks_ptr hooks;
  /// Optional: lines for the operator (e.g. that GPU memory is staged
  /// through host memory for RDMA); the sink prints each distinct line once.
  std::function<void(const std::string&)> notice;
};

} // namespace dualpath::actors
