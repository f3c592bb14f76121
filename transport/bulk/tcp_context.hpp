// What the tcp backend's sender and receiver share: the settings, the table
// of registered regions incoming writes land in, the counters and the
// handler of incoming immediates.
//
// Thread safety: `opts` is immutable after construction; every member
// function is thread-safe.
#pragma once

#include <mutex>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

class tcp_context {
public:
  explicit tcp_context(const options& o) : opts(o) {
    // nop
  }

  const options opts;
  region_table regions;

  void count(uint64_t counters::*field, uint64_t n = 1) {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    stats_.*field += n;
  }

  /// Runs `f(counters&)` under the counters' lock.
  template <class F>
  void update(F f) {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    f(stats_);
  }

  counters snapshot() const {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    return stats_;
  }

  void on_immediate(immediate_handler f) {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    handler_ = std::move(f);
  }

  void signal_immediate(const incoming_immediate& x) {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    if (handler_)
      handler_(x);
  }

private:
  mutable std::mutex stats_mtx_;
  counters stats_;
  std::mutex handler_mtx_;
  immediate_handler handler_;
};

} // namespace dualpath::transport::bulk
