// The latest load of every engine of one node and the node's storage read
// queue, in one place the node's group leader reads at each fetch/report tick.
//
// Without it the leader asked every member for its load by message at every
// tick, and every member asked the node's reader for the read queue: ~40
// messages per group per tick (every 10 ms), the largest share of all work in
// a 48P96D simulation even when nothing happened. Engines publish instead
// whenever their load changes (their own state only changes inside their
// handlers, so a published value is what a status request would have
// answered); the reader publishes whenever its queue changes.
//
// Thread safety: every member function may be called from any thread (one
// mutex). Ownership: shared by the node's actors (node_resources::loads).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "actors/protocol/messages.hpp"

namespace dualpath::actors {

class load_board {
public:
  /// Records the load of engine `x.engine.rank` (its read-queue fields are
  /// ignored: the node's reader publishes those). Ranks past the current
  /// size grow the board.
  void publish(const engine_load& x);

  /// Records the node's storage read queue.
  void publish_read_queue(const read_queue_status& q);

  /// The node's read queue as last published.
  read_queue_status read_queue() const;

  /// The last published load of every engine except rank `except`, in rank
  /// order, each completed with the node's read queue. Engines that never
  /// published are absent.
  std::vector<engine_load> others(uint32_t except) const;

private:
  mutable std::mutex mtx_;
  std::vector<std::optional<engine_load>> loads_;
  read_queue_status queue_;
};

} // namespace dualpath::actors
