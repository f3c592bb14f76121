#include "actors/engines/load_board.hpp"

namespace dualpath::actors {

void load_board::publish_read_queue(const read_queue_status& q) {
  std::lock_guard<std::mutex> guard{mtx_};
  queue_ = q;
}

read_queue_status load_board::read_queue() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_;
}

} // namespace dualpath::actors
