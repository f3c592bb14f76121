// A fixed set of threads running posted tasks in FIFO order: the blocking
// I/O of the pread backend and of the storage reader, off their callers'
// threads.
//
// Thread safety: post() may be called from any thread. Ownership: owns its
// threads; the destructor runs every task already posted, then joins them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dualpath::transport::storage {

class worker_pool {
public:
  /// Starts `threads` threads.
  explicit worker_pool(uint32_t threads);
  ~worker_pool();

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// Queues `task` for the next free thread.
  void post(std::function<void()> task);

private:
  void run();

  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_; // last: joined before the queue dies
};

} // namespace dualpath::transport::storage
