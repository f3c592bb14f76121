// A fixed set of threads running posted tasks in FIFO order: the blocking
// I/O of the pread backend and of the storage reader, off their callers'
// threads.
//
// Each thread may first run a start hook (its name and CPU class: a node runs
// its KV I/O threads below the threads that carry control messages); the
// constructor returns once every thread has run it, and start_error() is the
// first hook's error (then no task runs; post() drops tasks).
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

#include <caf/error.hpp>

namespace dualpath::transport::storage {

/// Runs first on each new worker thread; an error stops the pool.
using thread_start_hook = std::function<caf::error()>;

class worker_pool {
public:
  /// Starts `threads` threads, each running `on_start` (when set) first.
  explicit worker_pool(uint32_t threads, thread_start_hook on_start = {});
  ~worker_pool();

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// The first start hook's error; none when every thread started.
  const caf::error& start_error() const {
    return start_error_;
  }

  /// Queues `task` for the next free thread.
  void post(std::function<void()> task);

private:
  void run();

  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  caf::error start_error_;
  std::vector<std::thread> threads_; // last: joined before the queue dies
};

} // namespace dualpath::transport::storage
