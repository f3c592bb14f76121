// kv_client: the API an inference engine calls to load and save its KV cache
// through dualpath (docs/integration.md maps vLLM's KV connector and SGLang's
// HiCache onto it). It runs over the actors of an embedded cluster in the
// engine's process: one prefill node (the engine's own: its storage reader,
// DRAM buffer and bulk endpoint) and one decode node (the second read path),
// both built by actors/cluster's build_node over one block store on real
// files, their bulk transports local backends on one in-process fabric.
// Or (client_config::deployment) it joins a running deployment: the engine's
// node is built in this process as a deployment node (its settings, its
// cluster file's bulk secret and TLS), the decode node is a `dualpath node`
// process whose reader reads the DE blocks and whose bulk endpoint writes
// them into the engine's pages over the deployment's transport; the client
// polls the scheduler node's view and, when the decode node leaves it
// (killed, stopped, unreachable), fails every load waiting for it at once
// with transport_errc::peer_lost, reads later loads on the PE path (a forced
// DE load fails at once) and takes the node back when it returns.
//
//  - lookup (scheduler side, async): the longest stored prefix of a prompt,
//    in Full Blocks; poll its ticket until it answers.
//  - register_kv (worker side, once): the engine's paged KV memory (host
//    memory, or CUDA device memory: see register_kv), one region per layer,
//    page p of layer l at base_l + p * page_bytes where page_bytes =
//    block_tokens x bytes_per_token_layer (one Layer Block of the block format,
//    token-major). Each layer is registered once with the engine node's bulk
//    transport; loads and saves then post by page index.
//  - start_load: a request's hit blocks into the given pages. The path is
//    the global scheduler's choice (scheduler::plan_reads with the
//    configured read_mode over both nodes' storage read queues): blocks
//    [0, k) are read by the engine node's reader and written into the pages
//    over its loopback bulk transport (PE path), blocks [k, n) by the decode
//    node's reader and written over the fabric from the decode node's buffer
//    (DE path). A request may force a path (tests, operators).
//    Layers are posted in order (they may land out of order over tcp with
//    transport.tcp_kv_connections above 1; wait_for_layer counts per layer).
//  - wait_for_layer: blocks until layer l of every block that did not fail
//    is in its page (what an engine calls before layer l's attention).
//  - start_save: a request's new Full Blocks from its pages to storage: the
//    engine node's reader reserves buffer slots, the pages are written into
//    them over the bulk transport, and the reader persists each block (the
//    block format with its per-layer checksums, written atomically).
//  - finished: the loads and saves that ended since the last call, each with
//    its outcome; load_errors: the blocks of a load that failed (missing,
//    damaged or unreadable in storage), by position in the request. A failed
//    block and every block after it must be recomputed: the pages of failed
//    blocks hold no verified KV.
//
// Deadlines: every load and save has one (its own, else the configured
// default), and every bulk batch carries it (a batch past it fails with
// transport_errc::deadline_exceeded). A load whose reads are not answered by
// its deadline fails with caf::sec::request_timeout and ends then: the late
// reads only hand their buffer slots back, nothing lands in the pages after
// the load was reported. wait_for_layer returns at the deadline at the
// latest. A save's slot reservation has the deadline (the reader drops it
// unserved then, a late answer hands its slots back), so has its staging
// write; the save ends when the reader has answered every persist (a
// persist reads its staging slot until it answers, so the slot is never
// reused under it). Over a deployment a decode node that stays in the view
// but does not answer is waited for at most one second past the deadline
// (its sender fails batches past it and replies); then the client gives it
// up (drops its bulk peer, fails every load waiting for it) before the load
// is reported, and sets it up again at a later view. A broken connection to
// the decode node's reader or bulk endpoint loses it at once; a view
// request the scheduler node does not answer loses nothing.
//
// Failure: bad input (unknown pages, a page index past the registered
// memory, a ticket not issued, a second registration, tokens and pages that
// do not fit) is caf::sec::invalid_argument naming what was wrong, and
// nothing starts. A load whose blocks failed in storage still finishes (ok
// for the blocks before the first failure); a transport or deadline failure
// fails the whole load (no block is reported loaded).
//
// Thread safety: every member function may be called from any thread
// concurrently (the scheduler side and each worker thread of an engine);
// the destructor only when no other thread is inside a call.
// Ownership: the client owns its actor system, nodes and registrations; the
// engine owns its KV memory, which must stay valid and must not be freed
// while the client lives (register once, at start). Pages named by a load or
// save must not be touched by the engine until the operation is reported by
// finished() (a failed or timed-out operation is reported only once nothing
// of it can still write into the pages). The destructor waits for running
// operations to end (at most their deadlines).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "scheduler/path_choice.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/types.hpp"

namespace dualpath::actors::client {

using transport::block_hash;

/// The deployment a client joins (docs/deployment.md, docs/integration.md):
/// the engine's process hosts its own prefill-side node (storage reader,
/// DRAM buffer, bulk endpoint) as the cluster file's entry `node` names it
/// (its host and bulk_port; the file's bulk secret and TLS settings); the
/// second read path is a decode node of the deployment, a separate `dualpath
/// node` process, reached through the scheduler node's supervisor.
struct deployment_config {
  /// The deployment's cluster file.
  std::string cluster_file;
  /// This engine's node in it: a prefill entry that no `dualpath node`
  /// process runs (its bulk_port is the client's listener).
  std::string node;
  /// The decode node whose reader is the DE path; "": the file's first.
  std::string decode_node;
  /// The deployment's settings, as its nodes were started with them
  /// (--config FILE and --set KEY=VALUE, in order): the model, block size
  /// and byte scale give the KV geometry, transport.* the bulk transport.
  std::optional<std::string> config_file;
  std::vector<std::string> sets;
  /// How long make() waits for the scheduler node and the decode node.
  std::chrono::milliseconds patience{30'000};
};

/// The block store of a deployment as its nodes open it (directory, model id
/// and geometry), for an engine that populates or inspects it. Fails naming
/// the file, key or node that is wrong.
caf::expected<transport::storage::store_config>
deployment_store(const deployment_config& dep);

/// What the client is built with.
struct client_config {
  /// The block store's directory (created if absent) and model id.
  std::string store_dir;
  std::string model_id = "model";
  /// layers, block_tokens and bytes_per_token_layer of the engine's KV.
  transport::storage::kv_geometry geometry;
  /// The global scheduler's path policy for loads that do not force one.
  scheduler::read_mode reads = scheduler::read_mode::split;
  /// Full Blocks each node's DRAM buffer holds (reads and save staging).
  uint32_t buffer_blocks = 64;
  /// Each node's storage NIC, bytes per second (paces reads and writes).
  uint64_t snic_bytes_per_s = 50'000'000'000;
  /// Deadline of an operation that names none.
  std::chrono::milliseconds default_deadline{10'000};
  /// CPU class and niceness of the client's own KV work threads in the
  /// engine's process (its storage reader's I/O threads, and over a
  /// deployment the tcp transport's kv threads): normal by default, so that
  /// an engine whose compute threads fill every core does not starve its
  /// loads (a node process's default, idle, would). nice in [-20, 19].
  transport::bulk::tcp_cpu_sched kv_thread_sched =
      transport::bulk::tcp_cpu_sched::normal;
  int kv_thread_nice = 0;
  /// A deployment to join instead of the embedded nodes. Then store_dir,
  /// model_id and snic_bytes_per_s come from the deployment (its cluster
  /// file and settings); each geometry field given here must be the
  /// deployment's (else invalid_argument names it); buffer_blocks sizes the
  /// engine's own node; decode_faults are refused (invalid_argument).
  std::optional<deployment_config> deployment;
  /// Faults injected into the decode node's bulk transport (drills and
  /// tests: a lost decode node, failing or slow writes on the DE path); the
  /// default injects none.
  transport::bulk::fault_plan decode_faults;
};

/// A prompt's stored prefix.
struct prefix_hit {
  std::vector<block_hash> blocks; ///< Hit blocks, in prompt order.
  uint64_t hit_tokens = 0;        ///< blocks.size() x block_tokens.
};

/// Where a layer's pages live.
enum class memory_kind : uint8_t {
  host = 0, ///< Host memory: the transports write into it directly.
  cuda = 1, ///< CUDA device memory (a device pointer; see register_kv).
};

std::string to_string(memory_kind x);

/// One layer of the engine's paged KV memory (see the file comment).
struct kv_layer_memory {
  void* base = nullptr; ///< Host address, or device address for cuda.
  uint64_t bytes = 0;   ///< A multiple of the page size.
  memory_kind kind = memory_kind::host;
};

/// Which path reads a load's blocks.
enum class load_path : uint8_t {
  automatic = 0, ///< The global scheduler's choice (client_config::reads).
  pe = 1,        ///< Every block by the engine node's reader.
  de = 2,        ///< Every block by the decode node's reader, over the fabric.
  split = 3,     ///< Divided so both readers' queues drain together.
};

std::string to_string(load_path x);

/// Loads `blocks` (a prefix_hit's blocks, or a prefix of them) of request
/// `request_id` into `pages` (one page index per block, the same index in
/// every layer).
struct load_request {
  uint64_t request_id = 0;
  std::vector<block_hash> blocks;
  std::vector<uint32_t> pages;
  load_path path = load_path::automatic;
  std::chrono::milliseconds deadline{0}; ///< 0: the configured default.
};

/// Saves the Full Blocks [first_block, first_block + pages.size()) of the
/// prompt `tokens` (each page holds one block's KV in every layer).
struct save_request {
  uint64_t request_id = 0;
  std::vector<uint32_t> tokens;
  uint32_t first_block = 0;
  std::vector<uint32_t> pages;
  std::chrono::milliseconds deadline{0}; ///< 0: the configured default.
};

/// A load or a save that ended.
struct finished_op {
  enum class kind_t : uint8_t { load = 0, save = 1 };
  kind_t kind = kind_t::load;
  uint64_t ticket = 0;
  uint64_t request_id = 0;
  /// None: every block loaded or saved (a load's failed blocks aside, see
  /// load_errors). Else why the operation failed.
  caf::error error;
  /// Loads: the blocks before the first failed one are in their pages.
  uint32_t blocks_ok = 0;
  /// Which path read how many blocks (loads): the PE side reads [0, k).
  uint32_t pe_blocks = 0;
  uint32_t de_blocks = 0;
};

/// A block of a load that failed in storage.
struct block_error {
  uint32_t index = 0; ///< Position in load_request::blocks.
  block_hash hash = 0;
  caf::error error;
};

class kv_client {
public:
  /// Opens the block store, builds both nodes and starts their actors.
  /// Fails with caf::sec::invalid_argument for a geometry without layers,
  /// tokens or bytes, or a buffer of no block; with the store's error when
  /// its directory cannot be used.
  static caf::expected<std::unique_ptr<kv_client>> make(client_config cfg);

  ~kv_client();
  kv_client(const kv_client&) = delete;
  kv_client& operator=(const kv_client&) = delete;

  const transport::storage::kv_geometry& geometry() const;

  /// Bytes of one page (one Layer Block).
  uint64_t page_bytes() const;

  // -- scheduler side ---------------------------------------------------------

  /// Starts looking up the stored prefix of `tokens`; returns its ticket.
  uint64_t lookup(std::vector<uint32_t> tokens);

  /// The lookup's answer, or nullopt while it runs ("ask again later");
  /// an answered ticket is forgotten. Unknown tickets: invalid_argument.
  std::optional<caf::expected<prefix_hit>> lookup_result(uint64_t ticket);

  // -- worker side ------------------------------------------------------------

  /// Registers the engine's KV memory, one entry per layer (exactly
  /// geometry().layers). Once per client.
  ///
  /// Device pages (memory_kind::cuda) are never copied as a whole or moved:
  /// each must be CUDA device memory of one device (gpu/device_pages.hpp
  /// checks its first and last byte). Where the engine node's transport is
  /// verbs, the device memory itself is registered with the NIC (a dma-buf,
  /// ibv_reg_dmabuf_mr; else the device pointer, ibv_reg_mr through
  /// nvidia-peermem) and loads and saves are zero-copy: wait_for_layer(l)
  /// returns after the NIC's writes were made visible to the device.
  /// Otherwise (local, tcp, or verbs refusing both; kv_memory_path says
  /// why) the client sets up a pinned host staging area of the layer's size
  /// and registers that instead. A load lands in the staging area and is copied
  /// into the device pages on a CUDA stream: wait_for_layer(l) returns only
  /// after layer l's device copy completed, and wait() and finished()
  /// report a load only after every layer's did (a failed copy fails the
  /// load). A save first copies its pages device -> staging (and waits),
  /// then writes the staging area to storage. Without a CUDA device this
  /// fails with gpu_errc::no_device, "layer L: no CUDA device: " and the
  /// driver's reason; memory that is not device memory with
  /// gpu_errc::invalid_argument naming the address; nothing is registered
  /// on any failure.
  caf::error register_kv(const std::vector<kv_layer_memory>& layers);

  /// How the registered memory is reached, for operators and tests, e.g.
  /// "host pages: written in place by the bulk transport" or "device pages
  /// on cuda device 0 (NVIDIA H200): staged through pinned host memory
  /// (...why...)"; "" before register_kv.
  std::string kv_memory_path() const;

  /// Pages per layer of the registered memory (0 before register_kv).
  uint32_t pages() const;

  /// Starts a load; returns its ticket.
  caf::expected<uint64_t> start_load(load_request req);

  /// Waits until layer `layer` of load `ticket` landed in its pages (failed
  /// blocks aside) or the load failed; returns the failure, if any.
  caf::error wait_for_layer(uint64_t ticket, uint32_t layer);

  /// Starts a save; returns its ticket.
  caf::expected<uint64_t> start_save(save_request req);

  /// Waits until operation `ticket` (a load or a save) ended; its outcome.
  caf::expected<finished_op> wait(uint64_t ticket);

  /// The operations that ended since the last call (each reported once).
  std::vector<finished_op> finished();

  /// The failed blocks of load `ticket` so far (empty while none failed).
  std::vector<block_error> load_errors(uint64_t ticket) const;

  /// The file block `hash` is stored in (for operators and tests).
  std::string block_file(block_hash hash) const;

  struct impl;

private:
  explicit kv_client(std::unique_ptr<impl> p);
  static caf::expected<std::unique_ptr<kv_client>>
  make_deployed(client_config cfg);
  std::unique_ptr<impl> impl_;
};

} // namespace dualpath::actors::client
