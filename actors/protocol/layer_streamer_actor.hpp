// A layer streamer's interface: moves a batch's KV layer by layer within a
// window of resident layers so transfers overlap compute, and measures each
// step (read, transfer, H2D, compute, send).
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using layer_streamer_actor = caf::typed_actor<
    // Stream a batch; replies with per-layer timings once every layer is done.
    caf::replies_to<stream_atom, stream_plan>::with<stream_report>,
    // A decode engine wrote layer `layer` of a request's DE-side hit blocks
    // into the streamer's staging region (DE read path). The streamer also
    // receives this as the reply to its push requests.
    caf::reacts_to<layer_atom, layer_ready>>;

} // namespace dualpath::actors
