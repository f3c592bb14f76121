// CAF type-ID block of the transport module's shared value types (offset
// 200). Two blocks exist: this one and the actors' message vocabulary
// (actors/protocol/type_ids.hpp, offset 450); the other modules' messages
// travel inside those. The gap leaves each room to grow; a new module's block
// takes an offset of its own, and actors/protocol/register.cpp checks that no
// two blocks overlap.
#pragma once

#include <caf/type_id.hpp>

#include "transport/types.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(dualpath_transport, 200)
CAF_ADD_TYPE_ID(dualpath_transport, (dualpath::transport::traffic_class))
CAF_ADD_TYPE_ID(dualpath_transport, (dualpath::transport::remote_region))
CAF_END_TYPE_ID_BLOCK(dualpath_transport)
