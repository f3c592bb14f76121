// The prefill engine: prefills the requests the scheduler assigns to it. Each
// request becomes a job that goes through these phases, in arrival order:
//   1. start (at most `prefill_lookahead` jobs ahead of the oldest unfinished
//      one): the PE-side hit blocks are read by this node's storage reader
//      into the node's DRAM buffer (leases);
//   2. admission at the decode engine (one job at a time, in order), which
//      returns the decode slot and, on the DE read path, starts reading the
//      DE-side hit blocks there; the engine then asks for those leases;
//   3. ready: failed reads become misses (a failed block and every later one
//      of the request are recomputed), the decode engine is told the outcome
//      (prefill_summary);
//   4. streaming: ready jobs go to the layer streamer in order
//      (actors/engines/layer_streamer.hpp), which moves and computes the layers
//      one job at a time; the reply frees the leases.
// So the next jobs' storage reads and admissions overlap the current job's
// compute, as a real engine's load queue does; the look-ahead bounds the
// buffer and decode slots one engine holds to lookahead + 1 requests.
//
// Deadlock freedom: a job holds buffer leases only for itself, reads are
// issued in order (the reader serves its FIFO in order) and admissions are
// sequential per engine, so no later job holds a decode slot while an
// earlier one of the same engine waits for one. A cyclic wait would need a
// node's reader pool to be exhausted by completed look-ahead reads; the
// embedded cluster sizes each pool for far more (see actors/cluster).
//
// The load mode decides the plan once, here (plan_for):
//   basic, layerwise: every hit is read on the PE side;
//   dualpath: the scheduler's read plan (PE side, DE side or a split);
//   oracle: nothing is read or moved.
// The group leader (rank 0 with group_members) fetches work from the
// scheduler every fetch_period_ns and dispatches it to its members.
//
// A work batch's reply joins its requests' jobs (an error when one fails:
// the decode engine refused the admission or the streamer failed). The
// engine is an untyped actor behind the typed handle (it sends itself timer
// messages).
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"

namespace dualpath::actors {

/// The read plan a prefill engine applies in `mode` to the scheduler's plan
/// `plan` for a prompt with `full_blocks` full blocks.
read_plan plan_for(load_mode mode, read_plan plan, uint32_t full_blocks);

/// Spawns a prefill engine (and its layer streamer). Fails (the actor exits
/// at once with the error) if its staging memory cannot be set up.
prefill_engine_actor spawn_prefill_engine(caf::actor_system& sys,
                                          engine_config cfg);

} // namespace dualpath::actors
