// The decode engine: owns a DRAM buffer (dram_buffer_bytes nominal, real-
// scaled, allocated, pinned with the GPU and registered with the node's bulk
// transport once) cut into per-request slots by a range allocator; admission
// waits (FIFO) while the buffer is full. Per request:
//   admit: reserve the slot ([layer][prompt token][bpt]); on the DE read path
//     have this node's storage reader read the DE-side hit blocks
//     [pe_side_blocks, hit_blocks) and copy them into the slot (load_atom
//     answers with the outcome; failed blocks become misses at the PE);
//   push: write one layer of DE-side hit tokens into a prefill engine's
//     staging over the bulk transport (links: DE dram + DE cnic_tx[rank]);
//   layer_ready: the prefill engine wrote a layer (links: DE cnic_rx[rank] +
//     DE dram); once every layer and the prefill summary are in, prefill ends
//     (TTFT): the whole slot is verified byte for byte against the
//     deterministic KV (actors/engines/kv_layout.hpp), copied into GPU memory
//     once (links: DE dram + cnic_rx[rank]; waits while HBM is full), the DRAM
//     slot is freed, and gen_tokens - 1 decode steps run with the compute
//     model's TPOT (TTST = after the first step);
//   persist: after decode, every completed Full Block that storage lacks is
//     written through the reader (paced by the SNIC): the prompt's miss blocks
//     (recomputed ones included; their bytes come from GPU memory, D2H) and
//     the blocks completed by output_tokens (their KV generated from the
//     block hash). A trailing partial block is never persisted: the next turn
//     recomputes it. Then done(request_result) goes to the scheduler.
// Oracle: nothing is read, pushed or persisted; the slot is filled directly
// (the KV is assumed resident) and verified; no link is crossed.
//
// Decode steps of different requests are modelled independently (no batching
// effect on TPOT). The engine is an untyped actor behind the typed handle (it
// sends itself timer and completion messages).
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/decode_engine_actor.hpp"

namespace dualpath::actors {

/// Spawns a decode engine; the actor exits at once with the error if its
/// buffer cannot be set up.
decode_engine_actor spawn_decode_engine(caf::actor_system& sys,
                                        engine_config cfg);

} // namespace dualpath::actors
