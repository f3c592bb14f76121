// The prefill engine of one prefill node: it drives every GPU of the node as
// one expert-parallel group (each GPU is one engine, rank r, to the
// scheduler; attention is data-parallel: a request lives on the GPU it was
// placed on). Per request, one phase at a time (pe_phase,
// prefill_state.hpp):
//   reading    placed here by the scheduler (prefill): the PE-side hit
//              blocks [0, pe_side_blocks) go to the node's reader at once,
//              into the queue of the node's storage NIC, landing in the
//              node's DRAM buffer (slots reserved when the read starts);
//   queued     the read is in; waits in its GPU's FIFO;
//   admitting  near the head of its GPU's FIFO (within two batches' worth):
//              the decode node is asked for its slot (admit), which it
//              answers once its own decode-side read is in and the buffer
//              for the rest of the prompt is reserved;
//   ready      the slot is in: failed blocks (either side) turn the first
//              failed hit block and every later one into misses; the decode
//              node is told the outcome (prefill_summary); packable;
//   prefilling in a step (a chunk of its new tokens per step); after its last
//              chunk its leases go back and it leaves the engine.
//
// Steps: whenever no step runs and some GPU has a ready request, every GPU
// packs its batch, FIFO over its ready requests (packing.hpp):
//   batching::quota (the scheduler's modes): while the predicted attention
//     time fits scheduler.quota_ms, the request that overflows cut by binary
//     search (scheduler/compute_quota.hpp pack_batch) and prefilled in
//     chunks across steps;
//   batching::token_budget (basic, layerwise, dualpath-rr): up to
//     engines.basic_batch_tokens new tokens, the last request chunked;
// in both, the batch's resident KV must fit the GPU's HBM for KV: the
// window's layers (layerwise) or every layer (Basic). The engine hands the
// packed step to the node's layer streamer (actors/engines/streamer/),
// which runs the step's layers on the GPUs together and reports back (last
// layer loaded, per-request failures, step done). Once the running step's
// last layer is loaded, the engine packs the next step (not Basic, whose
// steps run in series, nor Oracle, which loads nothing): a request of the
// running step with tokens left counts as done with its running chunk. The
// streamer holds it beside the running one and loads its first layer ahead
// (layer_streamer.hpp), so it computes right after the running step: a
// layer lasts as long as its slowest GPU (engine_timing.hpp
// prefill_step_layer), with at most `layer_window` layers resident (Basic:
// all of them, loads, compute and sends in series).
//
// Per layer l of a step, on every GPU, for each chunk [first, first + n) of
// a request: its PE-side hits' Layer Blocks l are copied from the node's
// buffer into the GPU (H2D through the GPU's compute NIC: links node DRAM +
// cnic_rx; or as loopback writes of the bulk transport with
// h2d_via_transport); tokens [pe_side, first) (decode-side hits and earlier
// chunks' KV) are pushed by the decode node over RDMA (push); the layer
// computes; then the chunk's new tokens (and, with its first chunk, the
// PE-side hits) go to the decode node's buffer slots (bulk, kv class,
// cnic_tx) and the decode node is told (layer). One push, one layer message
// per decode node per layer of a step.
//
// Failures: a failed read block becomes a miss; a push or send that fails,
// or a decode node that is lost, fails the requests involved: their decode
// node drops what it holds for them and the scheduler re-queues them
// (request_failure), the rest of the step goes on. The engine spawns its
// streamer and they monitor each other: if the streamer goes down, the
// engine gives its requests' buffer slots back and stops with an error
// naming the streamer (the scheduler and the decode nodes re-queue and drop
// its requests); if the engine goes down, so does the streamer.
//
// The engine is a typed actor (prefill_engine_actor, its streamer's
// reports, private timers); it never blocks; it fetches work for its group
// every fetch_period_ns.
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"

namespace dualpath::actors {

/// Spawns the prefill engine of `cfg.node` and its layer streamer; the
/// engine exits with an error naming the streamer if the streamer's GPU
/// staging memory cannot be set up.
prefill_engine_actor spawn_prefill_engine(caf::actor_system& sys,
                                          engine_config cfg);

} // namespace dualpath::actors
