// The extension example of docs/extending.md: a storage reader behaviour
// that prefetches an agent's next-turn blocks while the agent's tool call
// runs. It is a decorator: it implements storage_reader_actor (so engines
// use it unchanged) in front of a node's default reader, and it is selected
// by configuration (`storage.reader = "prefetching"`).
//
// How it knows an agent's blocks: every read and every persist names blocks
// of one prefix chain (a block's hash covers its parent's). A persisted
// block (once durable) whose parent is the tail of a chain seen here extends
// that chain. The decode engine persists a turn's new blocks right after
// decode, when the turn's answer goes back and the agent starts its tool
// call. Once a chain's persists have settled (`settle`, actor clock), the
// reader reads the chain's last `per_chain` blocks into its DRAM pool
// (through the inner reader, so the storage NIC's pacing applies) and keeps
// the leases. A later read of those blocks (the agent's next turn: in
// DualPath's split, the decode side reads the prompt's tail) is served from
// the kept leases at once; the rest is read as usual. At most `max_blocks`
// leases are kept (oldest released first), so the inner reader's pool keeps
// room for ordinary reads.
//
// It reports its own metrics to the observer (periodic state_snapshot with
// dualpath_prefetch_* samples, source "prefetch.<node>"), which puts them on
// /metrics; see docs/extending.md for the few lines this takes.
//
// Ownership: the prefetching reader owns the node's reader (linked: they
// terminate together, and the kept leases go with the reader's pool).
// Thread safety: actor.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/meta/type_name.hpp>

#include "actors/protocol/observer_actor.hpp"
#include "actors/protocol/storage_reader_actor.hpp"

namespace dualpath::actors {

struct prefetch_config {
  std::string node;                    ///< For the snapshot's source name.
  uint32_t max_blocks = 256;           ///< Leases kept at most.
  uint32_t per_chain = 64;             ///< Tail blocks prefetched per chain.
  std::chrono::milliseconds settle{2}; ///< Quiet time after a persist.
  observer_actor observer;             ///< Optional: receives snapshots.
  std::chrono::milliseconds report_period{200};
};

/// What the reader counted (also the samples of its snapshots).
struct prefetch_stats {
  uint64_t prefetched = 0; ///< Blocks read ahead.
  uint64_t hits = 0;       ///< Blocks of later reads served from them.
  uint64_t misses = 0;     ///< Blocks of later reads read as usual.
  uint64_t evicted = 0;    ///< Prefetched blocks released unused.
  uint64_t kept = 0;       ///< Leases kept now.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefetch_stats& x) {
  return f(caf::meta::type_name("prefetch_stats"), x.prefetched, x.hits,
           x.misses, x.evicted, x.kept);
}

/// Spawns the prefetching reader in front of `inner` (which it stops when
/// it terminates: the prefetching reader owns the node's reader).
storage_reader_actor spawn_prefetching_reader(caf::actor_system& sys,
                                              storage_reader_actor inner,
                                              prefetch_config cfg);

} // namespace dualpath::actors
