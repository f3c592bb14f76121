// Posting a bulk batch from an actor. A backend may complete a batch before
// post() returns (the modeled backend of `dualpath sim` always does, on the
// caller's thread); such a completion is handed back to the caller as a value
// so the actor handles it in the same handler instead of sending itself a
// message (two jobs per layer transfer fewer in a simulation). A completion
// that comes later goes to `later`, on the backend's thread, as before.
//
// Thread safety: `later` runs on a backend thread; it must only send
// messages. Exactly one of "returned" and "later called" happens per batch.
#pragma once

#include <functional>
#include <optional>

#include "transport/bulk/backend.hpp"

namespace dualpath::actors {

std::optional<transport::bulk::completion>
post_or_complete(transport::bulk::backend& backend, transport::bulk::batch b,
                 std::function<void(transport::bulk::completion)> later);

} // namespace dualpath::actors
