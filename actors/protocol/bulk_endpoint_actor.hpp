// A node's bulk transport endpoint as an actor: exchanges connection details
// (tcp address, verbs queue-pair info) with peers and posts write batches on
// the node's behalf. The bytes move over the bulk transport, not CAF.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using bulk_endpoint_actor = caf::typed_actor<
    // Connect to a peer given its details; replies with this endpoint's own.
    caf::replies_to<connect_atom, endpoint_info>::with<endpoint_info>,
    // This endpoint's connection details.
    caf::replies_to<describe_atom>::with<endpoint_info>,
    // Post a batch of one-sided writes; replies when all complete or fail.
    caf::replies_to<write_atom, write_batch>::with<batch_completion>>;

} // namespace dualpath::actors
