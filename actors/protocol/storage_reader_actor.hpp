// A storage reader's interface: one per storage NIC per node. A FIFO read
// queue paced to the NIC's bandwidth; reads land in a budgeted DRAM buffer
// pool registered once with the bulk transport; completions carry buffer
// descriptors, never bytes. Also the write path for persistence.
#pragma once

#include <cstddef>

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

/// The most blocks one persist_batch may hold.
constexpr size_t max_persist_batch = 4096;

using storage_reader_actor = caf::typed_actor<
    // Read Full Blocks into the buffer pool; failed blocks are listed, not
    // fatal.
    caf::replies_to<read_atom, read_request>::with<read_completion>,
    // Reserve empty buffer slots for the listed blocks of a request (ahead
    // of queued reads, never limited by the read cap): leases whose slots
    // the caller fills.
    caf::replies_to<reserve_atom, reserve_request>::with<read_completion>,
    // Return a lease's buffer space to the pool.
    caf::reacts_to<release_atom, uint64_t>,
    // Return many leases at once (what a finished read's user does).
    caf::reacts_to<release_atom, lease_release>,
    // Persist a completed block to storage (replies with its hash when
    // durable).
    caf::replies_to<persist_atom, persist_request>::with<block_hash>,
    // Persist a chain of generated blocks (at most max_persist_batch): each
    // block's write is paced on the NIC as a single persist's would be, the
    // reply (how many were written) comes at the last one's time.
    caf::replies_to<persist_atom, persist_batch>::with<uint32_t>,
    // The read queue's length (read_q) in tokens and bytes.
    caf::replies_to<queue_atom>::with<read_queue_status>>;

} // namespace dualpath::actors
