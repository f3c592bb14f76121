// A decode engine's interface: owns a budgeted DRAM buffer for prompts being
// prefilled, serves hit Layer Blocks on the DE read path, merges miss KV, then
// copies the complete prompt KV into GPU memory once, decodes and persists
// each completed block.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using decode_engine_actor = caf::typed_actor<
    // Reserve buffer space for an assignment's prompt KV; on the DE read path
    // also start reading the decode-side hit blocks. Replies with the slot the
    // prefill engine writes Layer Blocks into.
    caf::replies_to<admit_atom, assignment>::with<decode_slot>,
    // Layer `layer` of a request is complete in the buffer.
    caf::reacts_to<layer_atom, layer_ready>,
    // The outcome of a request's decode-side read (after admit): its failed
    // blocks. No leases: the blocks are in the request's slot by then and
    // their reader buffers released.
    caf::replies_to<load_atom, uint64_t>::with<read_completion>,
    // DE read path: write DE-side hit tokens of one layer into a prefill
    // engine's region; replies when the write is complete.
    caf::replies_to<push_atom, layer_push>::with<layer_ready>,
    // The prefill engine's summary of a request (sent before its last layer).
    caf::reacts_to<prefilled_atom, prefill_summary>,
    // The prefill engine gave up on a request (its attempt failed): its
    // admission or slot is dropped, its buffer space freed.
    caf::reacts_to<release_atom, uint64_t>,
    // The engine's current seq_e / tok_e / read queue / free HBM.
    caf::replies_to<status_atom>::with<engine_load>>;

} // namespace dualpath::actors
