#include "actors/engines/load_board.hpp"

namespace dualpath::actors {

void load_board::publish(const engine_load& x) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (loads_.size() <= x.engine.rank)
    loads_.resize(size_t{x.engine.rank} + 1);
  loads_[x.engine.rank] = x;
}

void load_board::publish_read_queue(const read_queue_status& q) {
  std::lock_guard<std::mutex> guard{mtx_};
  queue_ = q;
}

read_queue_status load_board::read_queue() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return queue_;
}

std::vector<engine_load> load_board::others(uint32_t except) const {
  std::lock_guard<std::mutex> guard{mtx_};
  std::vector<engine_load> out;
  for (uint32_t rank = 0; rank < loads_.size(); ++rank) {
    if (rank == except || !loads_[rank])
      continue;
    out.push_back(*loads_[rank]);
    out.back().read_q_tokens = queue_.tokens;
    out.back().read_q_bytes = queue_.bytes;
  }
  return out;
}

} // namespace dualpath::actors
