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
// It may run on one of the pool's own threads (a task released the last
// reference to the pool's owner): then it runs the tasks left itself, joins
// the other threads, and the calling thread ends when its task returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
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
  /// The queue, shared with the threads: one that outlives the pool (it
  /// destroyed the pool from a task) still finds it.
  struct queue {
    std::mutex mtx;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
  };

  static void run(queue& q);

  std::shared_ptr<queue> q_ = std::make_shared<queue>();
  caf::error start_error_;
  std::vector<std::thread> threads_;
};

} // namespace dualpath::transport::storage
