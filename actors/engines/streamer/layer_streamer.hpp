// The layer streamer of a prefill node (interface and contracts:
// actors/protocol/layer_streamer_actor.hpp): runs the steps its prefill
// engine packed (actors/engines/prefill/packing.hpp), the node's GPUs
// together, at most `window` layers resident at once (Basic: every layer,
// with loads, compute and sends in series). Per layer l:
//   load     every chunk's PE-side hits of layer l into its GPU (H2D through
//            the GPU's compute NIC, or loopback bulk writes with
//            h2d_via_transport), and one push per decode node for the
//            decode-side tokens (its hits and earlier chunks' KV);
//   compute  once layer l - 1 is computed and layer l's loads are in (Basic:
//            every layer's), for the step's layer time on every GPU (the
//            slowest GPU's, engine_timing.hpp prefill_step_layer): the new
//            tokens' KV is the deterministic content (kv_layout.hpp);
//   send     every chunk's new tokens, and its PE-side hits with its first
//            chunk, into its decode node's buffer slots (one bulk batch per
//            decode node, kv class, cnic_tx); when the writes are done and
//            the emulated time has passed, one `layer` message per decode
//            node and layer l's GPU memory is freed for layer l + window.
// The next step (sent while one runs, once its last layer is loaded) loads
// its first layer ahead, once the running step's loads are all issued, into
// its own staging slot at the top of each GPU's HBM for KV, and computes it
// as soon as the running step's last layer is computed; its other layers
// load once the running step is sent. The slot is used only if, on every
// GPU, the larger of the two steps' windows plus the slot fits the HBM for
// KV (otherwise the next step loads once the running step is sent); its
// device buffer counts against the device's HBM budget like the window's.
// Basic runs its steps in series.
// Real bytes are copied at once (byte-scaled); the streamer waits the
// emulated time of every step with delayed messages. A push or send that
// fails, or a decode node that is lost, fails the requests involved (a
// send: the requests it carried to its one decode node), and the rest of
// the step goes on. The engine is told (`fail`, which makes it release the
// request's slot at its decode node) only once no send of the request is
// in flight, so no byte of it lands in a slot given to another request.
//
// Thread safety: an actor. Ownership: see layer_streamer_actor.hpp.
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/layer_streamer_actor.hpp"

namespace dualpath::actors {

/// Spawns the layer streamer of `cfg.node` working for `engine` (which it
/// monitors: it stops when the engine does). Its GPUs' staging (host
/// memory, pins, copy streams and their threads, registrations with the
/// node's bulk transport) is set up first, in the calling thread: the error
/// if that fails (or `cfg` lacks its node, a device per GPU or `engine`),
/// no actor.
caf::expected<layer_streamer_actor>
spawn_layer_streamer(caf::actor_system& sys, engine_config cfg,
                     layer_streamer_reports engine);

} // namespace dualpath::actors
