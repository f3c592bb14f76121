// Fluid lower bounds on a replay's JCT, from the replayed trace and the
// cluster's shape alone: how long the cluster would need if one resource were
// the only limit and were busy from the first instant to the last.
//
//   prefill_compute_s = total prefill FLOPs of every replayed request
//                       / (prefill_nodes x gpus_per_node x gpu_tflops x 1e12
//                          x gpu_efficiency)
//   pe_snic_s         = total hit bytes / (prefill_nodes x storage-NIC rate)
//   all_snic_s        = total hit bytes / ((prefill_nodes + decode_nodes)
//                                          x storage-NIC rate)
//
// A request's FLOPs are gpu::prefill_flops_per_layer x layers for (cached =
// its hit tokens, new = the rest of its prompt) with the configured model
// shape. Its hit tokens are what the block store gives it (hit_tokens()):
// the store holds Full Blocks only, the history is populated before replay
// and each request persists its prompt and output before the agent's next
// turn is submitted, so turn i of a trajectory hits the context before its
// append -- all earlier appends and generations -- rounded down to full
// blocks (the history for the first replayed turn; nothing for turn 0).
// Hit bytes are nominal: hit tokens x kv_bytes_per_token_layer x layers.
//
// Which bound applies to a mode (bound_for): Basic and layerwise read every
// hit through the prefill nodes' storage NICs, so max(compute, PE SNICs);
// DualPath (with or without its scheduler) can read through every storage
// NIC, so max(compute, all SNICs); Oracle reads nothing, so compute alone.
// None counts decode, the compute network or queueing: a JCT is at least its
// bound and usually above it.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "actors/cluster/cluster.hpp"
#include "actors/cluster/report.hpp"
#include "scheduler/workload/trajectory.hpp"

namespace dualpath::actors::cluster {

/// Tokens of turn `turn_index`'s prompt that the block store holds when it is
/// submitted (see the file comment). Precondition: turn_index <
/// traj.turns.size().
uint64_t hit_tokens(const scheduler::workload::trajectory& traj,
                    size_t turn_index, uint32_t block_tokens);

/// The bounds of replaying every turn of `replayed` from its history_turns
/// on, on a cluster of `spec`'s shape.
fluid_bounds trace_bounds(const scheduler::workload::trace& replayed,
                          const cluster_spec& spec);

/// The bound that applies to a mode loading KV as `mode` (file comment):
/// which one of `b`'s ("prefill_compute", "pe_snic" or "all_snic", the JSON
/// key) and its seconds.
mode_bound bound_for(const fluid_bounds& b, load_mode mode);

} // namespace dualpath::actors::cluster
