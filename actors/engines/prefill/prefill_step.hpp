// One step of a prefill node's GPUs (internal to actors/engines/prefill/):
// the GPUs' batches were packed (packing.hpp); the step runs their layers
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
// Real bytes are copied at once (byte-scaled); the actor waits the emulated
// time of every step with delayed messages.
//
// Thread safety: runs in the prefill engine's actor only.
#pragma once

#include "actors/engines/prefill/prefill_state.hpp"
