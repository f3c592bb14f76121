// A node supervisor's interface: starts a node's actors, joins the cluster and
// keeps the cluster view (monitoring every remote node).
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using node_supervisor_actor = caf::typed_actor<
    // A node joins; replies with the current cluster view.
    caf::replies_to<join_atom, node_info>::with<cluster_view>,
    // A node leaves on purpose (a lost node is noticed by monitoring).
    caf::reacts_to<leave_atom, std::string>,
    // The current cluster view.
    caf::replies_to<view_atom>::with<cluster_view>>;

} // namespace dualpath::actors
