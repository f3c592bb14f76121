// A decode node's interface: one engine drives every GPU of a decode node
// (one expert-parallel group; each GPU is one engine to the scheduler). It
// owns the node's DRAM buffer (through the node's storage reader), reads the
// DE-side hit blocks of its requests as soon as they are placed, serves them
// layer by layer to prefill GPUs, merges the KV the prefill engines send,
// then copies each complete prompt into its GPU's memory once and decodes
// every GPU's sequences in batches, persisting completed blocks.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using decode_engine_actor = caf::typed_actor<
    // The scheduler placed a request on one of this node's GPUs
    // (assignment.decode): its decode-side read starts now.
    caf::reacts_to<assign_atom, assignment>,
    // A prefill engine is about to send the request's first layer (the
    // assignment, in case it arrives before the scheduler's): replies once
    // the decode-side read is in and the buffer for the rest is reserved.
    caf::replies_to<admit_atom, assignment>::with<decode_slot>,
    // Write the listed tokens of one layer from this node's buffer into
    // prefill GPUs' staging (DE read path); replies with what moved.
    caf::replies_to<push_atom, layer_batch>::with<layer_batch>,
    // One layer of the listed chunks is in this node's buffer.
    caf::reacts_to<layer_atom, layer_batch>,
    // The prefill engine's summary of a request (before its first layer).
    caf::reacts_to<prefilled_atom, prefill_summary>,
    // The prefill engine gave up on a request (its attempt failed): what
    // this node holds for it is dropped, its buffer space freed.
    caf::reacts_to<release_atom, uint64_t>,
    // The loads of the node's GPUs (seq_e, tok_e, free HBM) and its read
    // queue.
    caf::replies_to<status_atom>::with<group_report>>;

} // namespace dualpath::actors
