// An emulated cluster inside one process: P prefill nodes and D decode nodes,
// each with its own storage NIC, DRAM and compute NICs (paced links), storage
// reader and DRAM buffer pool, bulk transport endpoint (local backend on a
// shared in-process fabric) and one engine per node driving its GPUs (each a
// CUDA device where the GPU plan has one, else host memory standing in for
// HBM), plus the global scheduler. All nodes share one real block store.
//
// The same actors run across processes (`dualpath node`); this builder is
// the single-process assembly used by `dualpath run` and the tests.
//
// Ownership: an embedded_cluster owns its nodes' resources and actors; its
// destructor stops the actors (and waits for them) before the resources they
// use are destroyed. The block store is shared with the caller, who may reuse
// it for the next mode.
// Thread safety: build and destroy from one thread; the actors run on the
// actor system's threads (or, in simulated time, on that one thread while it
// drives the system: see actors/sim/driver.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/cluster/report.hpp"
#include "actors/engines/engine_context.hpp"
#include "actors/observe/hooks.hpp"
#include "actors/placement/global_scheduler.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "config/settings.hpp"
#include "gpu/compute_model.hpp"
#include "gpu/device.hpp"
#include "scheduler/policy.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::transport::storage {
class block_store;
} // namespace dualpath::transport::storage

namespace dualpath::actors::cluster {

/// Whether KV bytes really move (emulation, `dualpath run`) or only their
/// timing is modelled (simulation, `dualpath sim`: modeled bulk and storage
/// backends, readers without I/O threads, no KV verification).
enum class data_plane : uint8_t {
  real = 0,
  modeled = 1,
};

/// The GPUs a process's engines use, decided once (plan_gpus()).
struct gpu_plan {
  /// host: host memory stands in for HBM; cuda: every engine rank on a CUDA
  /// device (gpu::device_for_rank), its KV layers in device memory.
  gpu::backend_kind kind = gpu::backend_kind::host;
  /// CUDA devices present (cuda only).
  int devices = 0;
  /// `gpu.device`: the device of engine rank 0 where a node lists no gpus.
  int first = 0;
  /// The choice and why, for the operator, e.g. "gpu.backend=auto: host
  /// memory stands in for HBM, because no CUDA device: no CUDA driver
  /// (...)".
  std::string reason;
};

/// Reads `gpu.backend` and `gpu.device` and probes CUDA (once per process):
/// `cuda` without a usable device, or a gpu.device the machine lacks, is bad
/// input (caf::sec::invalid_argument) naming the key and what is missing;
/// `auto` falls back to host memory where no device can be used and says
/// why. Only a real data plane needs one (`dualpath sim` counts HBM only).
caf::expected<gpu_plan> plan_gpus(const config::settings& cfg);

/// Everything the cluster is built from (derived from the configuration).
struct cluster_spec {
  uint32_t prefill_nodes = 2;
  uint32_t decode_nodes = 4;
  uint32_t gpus_per_node = 8;
  uint64_t snic_bytes_per_s = 50'000'000'000;
  uint64_t cnic_bytes_per_s = 50'000'000'000;
  uint64_t dram_bytes_per_s = 500'000'000'000;
  gpu::model_shape model;
  gpu::gpu_rate gpu;
  uint64_t hbm_bytes = 80ull << 30;         ///< Per GPU, nominal.
  uint64_t dram_buffer_bytes = 80ull << 30; ///< Per node, nominal.
  /// The group step model (efficiency curve, routed share, layer
  /// overhead); weight_bytes_per_gpu is set per role by the engines.
  gpu::group_params group_model;
  /// Parameters stored and the GPUs a replica spreads them over.
  double total_params = 0;
  /// hardware.slice: the emulated GPUs stand for 1/slice of the modeled
  /// cluster's (weights are spread as in the whole).
  uint32_t slice = 1;
  uint32_t prefill_ep = 16;
  uint32_t decode_ep = 32;
  uint64_t activation_reserve_bytes = 8ull << 30; ///< Per GPU, nominal.
  double quota_s = 0.3;
  uint32_t basic_batch_tokens = 16384;
  /// The longest prompt the workload allows (workload.max_len): the
  /// headroom a decode node's buffer keeps for reservations.
  uint64_t max_prompt_tokens = 65536;
  bool h2d_via_transport = false;
  uint32_t block_tokens = 64;
  uint32_t byte_scale = 1; ///< Nominal bytes per real byte.
  double time_scale = 1.0; ///< Emulated seconds per wall second.
  load_mode mode = load_mode::dualpath;
  scheduler::policy_config policy;
  uint32_t layer_window = 2;
  int64_t fetch_period_ns = 10'000'000;
  uint32_t reader_io_threads = 2;
  uint32_t reader_queue_depth = 8;
  /// CPU class of the node's KV work threads outside the bulk transport:
  /// the storage readers' I/O threads and the host GPU streams' copy and
  /// checksum threads. They follow the tcp backend's kv threads
  /// (`transport.tcp_kv_sched`, `transport.tcp_kv_nice`): below the CAF
  /// threads that carry control messages (fetches, reports, layer notices),
  /// so a KV read or copy never holds a core a control message waits for.
  transport::bulk::tcp_cpu_sched kv_thread_sched =
      transport::bulk::tcp_cpu_sched::idle;
  int kv_thread_nice = 10;
  /// Storage reader behaviour (`storage.reader`): "default" or
  /// "prefetching" (actors/storage/prefetching_reader.hpp) with at most
  /// `prefetch_blocks` blocks kept.
  std::string reader = "default";
  uint32_t prefetch_blocks = 256;
  /// Observation (optional): hooks for spans and metrics, and the observer
  /// that receives events and actors' own snapshots.
  observe::hooks_ptr hooks;
  observer_actor observer;
  data_plane plane = data_plane::real;
  /// Where the engines' KV lives on a real data plane (plan_gpus(); the
  /// default is host memory).
  gpu_plan gpus;
  /// Lines for the operator (the rank -> device map, GPU memory staged
  /// through host memory for RDMA); the sink prints each distinct line once.
  /// Null: none.
  std::function<void(const std::string&)> notice;
  /// Model layers the engines take as one step (`sim.layers_per_step`,
  /// coarsen()); applied on a modeled data plane only.
  uint32_t layers_per_step = 1;
};

/// The start hook of one of the node's KV work threads (spec.kv_thread_sched
/// and kv_thread_nice; the thread named `name`, at most 15 characters, a
/// string literal): device_options::thread_start and
/// storage_reader_config::io_thread_start.
std::function<caf::error()> kv_thread_start(const cluster_spec& spec,
                                            const char* name);

/// Reads a cluster_spec from the configuration for `mode`. Fails naming the
/// key when values do not fit together (e.g. a byte scale that leaves no real
/// byte per token and layer).
caf::expected<cluster_spec> spec_from(const config::settings& cfg,
                                      load_mode mode);

/// Nominal KV bytes of one token over all layers.
uint64_t kv_bytes_per_token(const gpu::model_shape& m);

/// The real bytes per token per layer the block store holds.
uint64_t real_bytes_per_token_layer(const cluster_spec& spec);

/// Nominal HBM bytes per GPU of `role` left for KV: HBM - the weights one
/// GPU holds (total_params x bytes per param / min(ep, the role's GPUs x
/// hardware.slice)) -
/// the activation reserve (0 when nothing is left).
uint64_t hbm_kv_bytes(const cluster_spec& spec, engine_role role);

/// Weight bytes one GPU of `role` holds.
double weight_bytes_per_gpu(const cluster_spec& spec, engine_role role);

/// The node's DRAM buffer in Full Block slots, and the slots reads may hold
/// (decode nodes keep the longest prompt's blocks free for reservations).
struct buffer_slots {
  uint32_t slots = 0;
  uint32_t read_cap = 0;
};
buffer_slots buffer_slots_of(const cluster_spec& spec, engine_role role);

/// One node's resources as a cluster builds them (links, bulk backend,
/// storage reader with its registered buffer pool), plus what must stay alive
/// while its actors run (the pool and its registration, released in reverse).
struct built_node {
  node_ptr node;
  /// Registration first, then the pool: clear() releases them in order.
  std::vector<std::shared_ptr<void>> keep_alive;
};

/// Builds node `name` of `role` around `bulk` (local backend in one process,
/// tcp or verbs across processes) and `store`; the reader paces its reads on
/// the node's storage NIC in emulated time `time`. Used by embedded_cluster
/// and by `dualpath node` (actors/node/).
caf::expected<built_node>
build_node(caf::actor_system& sys, const cluster_spec& spec,
           const std::string& name, engine_role role,
           std::shared_ptr<transport::bulk::backend> bulk,
           std::shared_ptr<transport::storage::block_store> store,
           const emulated_time& time);

/// The scheduler's engine table for a cluster of the spec's shape: prefill
/// nodes `prefill_names` (groups 0..P-1, node indices 0..P-1), then decode
/// nodes `decode_names` (groups 0..D-1, node indices P..P+D-1), each with
/// spec.gpus_per_node engines.
scheduler_config
scheduler_config_for(const cluster_spec& spec,
                     const std::vector<std::string>& prefill_names,
                     const std::vector<std::string>& decode_names,
                     std::shared_ptr<transport::storage::block_store> store);

/// The engine configuration of one node (before devices are attached).
engine_config engine_config_for(const cluster_spec& spec, const node_ptr& node,
                                uint32_t group, const emulated_time& time,
                                const scheduler_actor& scheduler);

/// Spawns the engine of one node (it drives every GPU of the node) and
/// enrolls each of its GPUs with `scheduler` (a local or remote handle).
/// `group` is the node's group index within its role. Each GPU gets its own
/// device (HBM budget real_bytes(hbm_kv_bytes), reserved as one pool slab):
/// on a CUDA plan, rank r runs on device `node_gpus[r]` (the cluster file's
/// gpus list) or (gpus.first + r) mod gpus.devices, stated through
/// spec.notice.
caf::expected<caf::actor>
spawn_node_engine(caf::actor_system& sys, const cluster_spec& spec,
                  const node_ptr& node, uint32_t group,
                  const emulated_time& time, const scheduler_actor& scheduler,
                  const std::vector<uint32_t>& node_gpus = {});

class embedded_cluster {
public:
  /// Builds and starts every node, engine and the scheduler. `store` must
  /// have the spec's geometry (layers, block_tokens, real bytes).
  static caf::expected<std::unique_ptr<embedded_cluster>>
  make(caf::actor_system& sys, const cluster_spec& spec,
       std::shared_ptr<transport::storage::block_store> store);

  ~embedded_cluster();

  embedded_cluster(const embedded_cluster&) = delete;
  embedded_cluster& operator=(const embedded_cluster&) = delete;

  const scheduler_actor& scheduler() const {
    return scheduler_;
  }

  /// Maps the actor clock to emulated time (started when the cluster was).
  const emulated_time& time() const {
    return time_;
  }

  /// Nominal bytes each storage NIC moved so far.
  std::vector<snic_usage> snic_usage_now() const;

  const std::vector<node_ptr>& nodes() const {
    return nodes_;
  }

  /// Stops every actor and waits for them (also done by the destructor).
  void shutdown();

private:
  embedded_cluster(caf::actor_system& sys, cluster_spec spec);

  caf::actor_system& sys_;
  cluster_spec spec_;
  emulated_time time_;
  std::vector<node_ptr> nodes_;
  std::vector<std::shared_ptr<void>> keep_alive_; // pools, registrations
  std::vector<caf::actor> actors_;                // engines, readers
  scheduler_actor scheduler_;
  bool stopped_ = false;
};

} // namespace dualpath::actors::cluster
