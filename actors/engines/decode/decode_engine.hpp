// The decode engine of one decode node: it drives every GPU of the node (one
// expert-parallel group; each GPU is one engine, rank r, to the scheduler)
// and owns the node's DRAM buffer through the node's storage reader (its
// buffer pool, one slot per Full Block, registered once with the bulk
// transport). Per request, one phase at a time (de_phase in the .cpp):
//   reading    placed here by the scheduler (assign): the decode-side hit
//              blocks [pe_side_blocks, hit_blocks) go to the node's reader
//              at once, into the queue of the node's storage NIC (the queue
//              the scheduler's path choice compares); their bytes land in
//              buffer slots reserved when the read starts;
//   waiting    the read is in (failed blocks listed); nothing else is held;
//   reserving  the prefill engine is about to send the first layer (admit):
//              buffer slots for every other block of the prompt (the
//              prefill-side hits, misses, a trailing partial block) are
//              reserved through the reader (reserve, ahead of its reads);
//   receiving  the slot was answered (decode_slot: one region per block):
//              the prefill engine pushes decode-side tokens to its GPU
//              layer by layer (push) and writes each layer's other tokens
//              into the slots (layer), the summary (prefilled) first;
//   finishing  every layer of every token is in: at the last arrival the
//              prompt is verified byte for byte (Full Block layout,
//              kv_layout.hpp); TTFT;
//   loading    copied into its GPU's memory once (links: node DRAM and the
//              GPU's compute NIC), after which every buffer slot is released;
//              waits while the GPU's HBM holds other sequences' KV;
//   decoding   in its GPU's batch: the node's GPUs step together (expert
//              parallel), a step as long as the slowest GPU's roofline of
//              its batch (engine_timing.hpp decode_step); one token per step
//              per sequence, sequences join and leave at step boundaries;
//              TTST after its first step, TPOT = (last token - first) /
//              (gen_tokens - 1);
//   persisting every completed Full Block storage lacks (the prompt's misses
//              from GPU memory, D2H, and the blocks output_tokens complete)
//              is written through the reader; then done(request_result).
// Oracle: nothing is read, pushed or persisted; the KV is assumed resident
// (filled and verified in a scratch block); no link is crossed.
//
// HBM: each GPU has hbm_kv_bytes for KV (HBM - weights per GPU - activation
// reserve). A request placed on a GPU commits (prompt + gen_tokens) x KV
// bytes per token until it is done; the GPU reports hbm_kv_bytes - committed
// as its free HBM, so the scheduler places no more than the GPU can decode.
//
// Deadlock freedom of the node's buffer (tested with the buffer exhausted):
// (1) the reader serves reads FIFO with head-of-line blocking on buffer
//     room, and a node's reads are issued in the order the scheduler placed
//     the requests (one sender per node: the scheduler's assigns to this
//     engine; the prefill node's engine for its own reads);
// (2) reads may hold at most read_cap = slots - headroom slots, headroom =
//     the blocks of the longest prompt the workload allows (plus one), and
//     reservations are served ahead of reads, whole or not at all;
// (3) a request that holds a reservation never waits for buffer room again:
//     its prefill needs only GPU time at its prefill node, its decode only
//     HBM, which decodes free as they finish.
// Then some request always progresses: take the earliest-placed request R
// whose reads are not all in. Every read ahead of R's in any reader's FIFO
// belongs to an earlier request, whose reads are all in, so it can get its
// reservation: when no reservation is held, free >= slots - read_cap =
// headroom >= its rest (2); when some are held, those requests finish and
// free theirs (3). Finished requests free their reads' slots too, so R's
// reads reach the head and find room.
//
// The engine is a typed actor (decode_engine_actor plus private timers).
// Thread safety: actor. Ownership: the buffer pool and its registration
// belong to the node (node_resources), which outlives the engine.
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/decode_engine_actor.hpp"

namespace dualpath::actors {

/// Spawns the decode engine of `cfg.node`; the actor exits at once with the
/// error if its GPUs or buffer cannot be set up.
decode_engine_actor spawn_decode_engine(caf::actor_system& sys,
                                        engine_config cfg);

} // namespace dualpath::actors
