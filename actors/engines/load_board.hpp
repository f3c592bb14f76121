// The node's storage read queue as its reader last published it, in one
// place the node's engine reads at each fetch/report tick (instead of asking
// the reader by message every 10 ms: the largest share of a 48P96D
// simulation's work when nothing happened). The reader publishes whenever
// its queue changes.
//
// Thread safety: every member function may be called from any thread (one
// mutex). Ownership: shared by the node's actors (node_resources::loads).
#pragma once

#include <mutex>

#include "actors/protocol/messages.hpp"

namespace dualpath::actors {

class load_board {
public:
  /// Records the node's storage read queue.
  void publish_read_queue(const read_queue_status& q);

  /// The node's read queue as last published.
  read_queue_status read_queue() const;

private:
  mutable std::mutex mtx_;
  read_queue_status queue_;
};

} // namespace dualpath::actors
