// The behaviour of storage_reader_actor
// (actors/protocol/storage_reader_actor.hpp): one storage reader per storage
// NIC per node.
//
// - Reads are served FIFO: blocks of a later request are issued only after
//   every block of the earlier ones was issued. The queue's length (read_q)
//   counts the tokens and Full Block bytes of requests not yet completed.
// - Each block lands in one slot of a budgeted buffer_pool (allocated once, so
//   the bulk transport registers it once). When every slot is leased, reads
//   wait until a release: memory never grows beyond the budget. A request
//   needing more slots than the pool has fails with over_budget.
// - The pool is the node's DRAM buffer, shared by reads and reservations:
//   `reserve` takes empty slots for blocks a caller will fill (the decode
//   node's place for the KV a prefill engine sends), served ahead of queued
//   reads; reads may hold at most `read_cap` slots, so the rest (the
//   headroom) is always left to reservations. With every read's leases held
//   until its request completes, a cap of pool - headroom, headroom >= the
//   largest reservation, keeps reads from starving reservations (see
//   actors/engines/decode/decode_engine.hpp for the whole argument).
// - Completions carry buffer_lease descriptors (remote_region of the pool:
//   node, region id, key, base address, offset of the Full Block payload);
//   never bytes. A lease holds its slot until release_atom.
// - Blocks that fail (missing, truncated, corrupt, I/O error, other model)
//   are listed in read_completion.failed, counted, and never leased: they
//   become misses to recompute.
// - Pacing: every read and every persisted block reserves its payload bytes
//   on the NIC through `pace` (reads and writes share it) at issue time, and
//   completes no earlier than the reserved time, waited for with delayed
//   messages on the actor clock (works under simulated time).
// - The disk I/O runs on `io_threads` worker threads that report back with
//   messages; io_threads = 0 runs it inline on the actor's thread (for
//   deterministic single-threaded tests only).
//
// Thread safety: the actor is the only user of its state; the counters are
// atomics readable from anywhere.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/observe/hooks.hpp"
#include "actors/protocol/storage_reader_actor.hpp"
#include "transport/link_pacer.hpp"

namespace dualpath::transport::storage {
class block_store;
class buffer_pool;
} // namespace dualpath::transport::storage

namespace dualpath::actors {

/// Counters of one reader, shared with observers.
struct storage_reader_counters {
  std::atomic<uint64_t> blocks_read{0};    ///< Blocks leased.
  std::atomic<uint64_t> blocks_failed{0};  ///< Blocks turned into misses.
  std::atomic<uint64_t> bytes_read{0};     ///< Payload bytes leased.
  std::atomic<uint64_t> blocks_written{0}; ///< Blocks persisted.
  /// Blocks a persist did not write: a failed persist_request, and a
  /// persist_batch's blocks from its failed one on (the rest chain on it).
  std::atomic<uint64_t> writes_failed{0};
  std::atomic<uint64_t> bytes_written{0}; ///< Payload bytes persisted.
};

struct storage_reader_config {
  using time_point = std::chrono::steady_clock::time_point;

  /// Reserves `bytes` on the storage NIC at actor-clock time `now` and returns
  /// the actor-clock time at which the transfer may complete.
  using pace_fn = std::function<time_point(uint64_t bytes, time_point now)>;

  /// Maps a region (the source of a persist_request) to its bytes in this
  /// process, or fails. Region bytes must stay valid until the reply.
  using resolve_fn =
      std::function<caf::expected<const std::byte*>(const remote_region&)>;

  std::string node;        ///< Node name in lease descriptors.
  uint32_t region_id = 0;  ///< The pool's registration id at the node.
  uint64_t region_key = 0; ///< The pool registration's access key.
  std::shared_ptr<transport::storage::block_store> store;
  std::shared_ptr<transport::storage::buffer_pool> pool;
  pace_fn pace;       ///< Empty: unpaced.
  resolve_fn resolve; ///< Empty: only regions of the own pool resolve.
  /// Threads doing disk I/O; reads in flight at the disk are
  /// min(io_threads, max_inflight). 0 = inline I/O (deterministic tests only).
  uint32_t io_threads = 4;
  /// Runs first on each I/O thread (its name and CPU class: the node puts
  /// KV reads below its control traffic); an error fails
  /// spawn_storage_reader with it.
  std::function<caf::error()> io_thread_start;
  uint32_t max_inflight = 8; ///< Blocks read at once (disk queue depth).
  /// Slots reads may hold at once (issued and leased); 0: the whole pool.
  /// A read needing more fails with over_budget.
  uint32_t read_cap = 0;
  /// Modeled data plane (simulation): a read only checks that the store
  /// indexes the block (a missing one fails as usual); no byte lands in the
  /// pool. Timing is unchanged (the NIC is paced either way).
  bool modeled_reads = false;
  /// With modeled_reads and inline I/O: the blocks of a read that complete
  /// together and consecutively become one lease (buffer_lease::blocks), and
  /// pool places are counted instead of leased slot by slot (no byte lands
  /// there). A request's ~500 leases become ~20: per-block leases were a
  /// fifth of a 48P96D simulation. Consumers must count a lease as
  /// `blocks` blocks (the engines and the streamer do; the prefetching
  /// reader keeps blocks one by one, so a reader it wraps has this off).
  bool lease_runs = false;
  std::shared_ptr<storage_reader_counters> counters; ///< Optional.
  /// Optional (null: not observed): read spans, read_q and block metrics.
  observe::hooks_ptr hooks;
  /// Optional: called on the reader's thread with the read queue whenever
  /// it changes (the node's load_board, read by its group leader).
  std::function<void(const read_queue_status&)> on_queue;
};

/// A pace function over a shared link_pacer (reads and writes of one NIC
/// share the pacer; pass the same pacer to everything using that NIC).
storage_reader_config::pace_fn
pace_with(std::shared_ptr<transport::link_pacer> pacer);

/// Spawns a storage reader, its I/O threads started (and their start hook
/// run) before it returns. Fails with invalid_argument when store or pool is
/// missing or a pool slot cannot hold a block file of the store, and with
/// io_error naming the reader when an I/O thread cannot start.
caf::expected<storage_reader_actor>
spawn_storage_reader(caf::actor_system& sys, storage_reader_config cfg);

} // namespace dualpath::actors
