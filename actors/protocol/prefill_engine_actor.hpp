// A prefill engine's interface: prefills assigned requests layer by layer (or
// all at once in Basic mode) and streams each layer's KV to the decode engine.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using prefill_engine_actor = caf::typed_actor<
    // Prefill a batch of assignments; replies when every layer's KV has been
    // sent to the decode engines.
    caf::replies_to<prefill_atom, work_batch>::with<stream_report>,
    // The engine's current seq_e / tok_e / read queue / free HBM.
    caf::replies_to<status_atom>::with<engine_load>>;

} // namespace dualpath::actors
