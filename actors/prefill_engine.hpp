// The prefill engine: prefills batches of assignments. For each assignment it
// admits the request at its decode engine (which returns the decode slot and,
// on the DE read path, starts reading the DE-side hit blocks), has this
// node's storage reader read the PE-side hit blocks, turns failed reads into
// misses (a failed block and every later one of the request are recomputed),
// tells the decode engine the outcome (prefill_summary) and hands the batch
// to its layer streamer (actors/layer_streamer.hpp), which moves and computes
// the layers. The load mode decides the plan once, here (plan_for):
//   basic, layerwise: every hit is read on the PE side;
//   dualpath: the scheduler's read plan (PE side, DE side or a split);
//   oracle: nothing is read or moved.
// The group leader (rank 0 with group_members) fetches work from the
// scheduler every fetch_period_ns and dispatches it to its members.
//
// Batches are prefilled one at a time, in arrival order (a GPU runs one
// batch). The engine is an untyped actor behind the typed handle (it sends
// itself timer messages).
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engine_context.hpp"
#include "actors/prefill_engine_actor.hpp"

namespace dualpath::actors {

/// The read plan a prefill engine applies in `mode` to the scheduler's plan
/// `plan` for a prompt with `full_blocks` full blocks.
read_plan plan_for(load_mode mode, read_plan plan, uint32_t full_blocks);

/// Spawns a prefill engine (and its layer streamer). Fails (the actor exits
/// at once with the error) if its staging memory cannot be set up.
prefill_engine_actor spawn_prefill_engine(caf::actor_system& sys,
                                          engine_config cfg);

} // namespace dualpath::actors
