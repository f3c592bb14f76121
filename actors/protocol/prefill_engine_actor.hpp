// A prefill node's interface: one engine drives every GPU of a prefill node
// (one expert-parallel group; each GPU is one engine to the scheduler, rank
// r of the node). It reads the PE-side hit blocks of its requests, steps its
// GPUs together layer by layer through its layer streamer
// (layer_streamer_actor.hpp), which streams each layer's KV to the decode
// nodes.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using prefill_engine_actor = caf::typed_actor<
    // Requests the scheduler placed on this node's GPUs (assignment.prefill
    // names the GPU); their PE-side reads start now.
    caf::reacts_to<prefill_atom, work_batch>,
    // The loads of the node's GPUs (seq_e, tok_e, free HBM) and its read
    // queue.
    caf::replies_to<status_atom>::with<group_report>>;

} // namespace dualpath::actors
