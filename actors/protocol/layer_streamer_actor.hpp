// A prefill node's layer streamer: runs the packed steps of the node's GPUs
// layer by layer for the node's prefill engine (one streamer per prefill
// node, spawned by its engine). Per layer of a step: load the PE-side hits
// into the GPUs and have the decode nodes push theirs, compute, send the
// layer's KV to the decode nodes' buffer slots and tell them (`layer`),
// with at most `window` layers resident (Basic: every layer, loads,
// compute and sends in series). It reports to its engine
// (layer_streamer_reports, which the engine takes besides
// prefill_engine_actor): `step_loaded` when a step's last layer is in GPU
// memory, `fail` per request that failed inside a step, `done` at the end.
//
// Ownership: the streamer owns the GPUs' staging (host memory mirroring
// each GPU's HBM for KV, pinned with its device, registered with the node's
// bulk transport) and the device buffers of the resident layers; the PE-side
// buffer leases named in a step stay the engine's, which keeps them until
// `step_loaded` (or the step's end). Lifetime: the streamer and its engine
// monitor each other; if one goes down the other fails its work with an error
// naming it and stops. Thread safety: an actor; at most two steps at once,
// the running one and the next (which its engine sends once the running one
// is loaded, `step_loaded`): a third one fails its requests.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using layer_streamer_actor = caf::typed_actor<
    // Run a packed step's layers now (emulated time starts at receipt).
    caf::reacts_to<run_step_atom, prefill_step>,
    // A decode engine was lost: the running step's requests with it are
    // skipped (their engine failed them) and pushes awaited from it settle.
    caf::reacts_to<lost_atom, caf::actor_addr>>;

/// What a layer streamer tells its prefill engine, in this order per step.
using layer_streamer_reports = caf::typed_actor<
    // Step `step`'s last layer is in GPU memory: the PE-side leases of the
    // requests whose last chunk it holds can go back.
    caf::reacts_to<step_loaded_atom, uint64_t>,
    // Request `request` failed inside step `step` (the error says why): its
    // decode node and the scheduler are to be told.
    caf::reacts_to<fail_atom, uint64_t, uint64_t, caf::error>,
    // Step `step` is done: every layer of it is sent.
    caf::reacts_to<done_atom, uint64_t>>;

} // namespace dualpath::actors
