// The global scheduler's interface: one waiting queue for the whole cluster;
// engine-group leaders fetch work from it and report their groups' load.
// Placement (which prefill engine, which decode engine) and path choice (which
// side reads the hit blocks, or a split) are made here (scheduler/ policies).
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/protocol/type_ids.hpp"

namespace dualpath::actors {

using scheduler_actor = caf::typed_actor<
    // Queue a request; the reply arrives when the request has completed.
    caf::replies_to<submit_atom, request_spec>::with<request_result>,
    // A prefill group leader fetches work, reporting its group's load.
    caf::replies_to<fetch_atom, group_report>::with<work_batch>,
    // A decode group leader reports its group's load (used for DE selection).
    caf::reacts_to<report_atom, group_report>,
    // An engine registers itself; the scheduler monitors it.
    caf::replies_to<enroll_atom, engine_registration>::with<bool>,
    // An engine reports a request finished (routes the result to the
    // submitter).
    caf::reacts_to<done_atom, request_result>,
    // An engine reports that its attempt at a request failed: the request is
    // re-queued (a reroute), or after max_attempts its submitter gets the
    // error.
    caf::reacts_to<fail_atom, request_failure>>;

} // namespace dualpath::actors
