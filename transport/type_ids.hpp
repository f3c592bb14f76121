// CAF type-ID block of the transport module's shared value types. Each module
// owns a block at a fixed offset (transport 200, transport_storage 250,
// transport_bulk 300, gpu 350, scheduler 400, actors 450) so modules can grow
// independently; actors/register.cpp checks that the blocks do not overlap.
#pragma once

#include <caf/type_id.hpp>

#include "transport/types.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(dualpath_transport, 200)
CAF_ADD_TYPE_ID(dualpath_transport, (dualpath::transport::traffic_class))
CAF_ADD_TYPE_ID(dualpath_transport, (dualpath::transport::remote_region))
CAF_END_TYPE_ID_BLOCK(dualpath_transport)
