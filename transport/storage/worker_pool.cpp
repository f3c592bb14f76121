#include "transport/storage/worker_pool.hpp"

#include <future>
#include <utility>

namespace dualpath::transport::storage {

worker_pool::worker_pool(uint32_t threads, thread_start_hook on_start) {
  std::vector<std::future<caf::error>> started;
  for (uint32_t i = 0; i < threads; ++i) {
    std::promise<caf::error> p;
    started.push_back(p.get_future());
    threads_.emplace_back([this, &on_start, p = std::move(p)]() mutable {
      auto err = on_start ? on_start() : caf::error{};
      bool ok = !err;
      p.set_value(std::move(err)); // `on_start` may end after this call
      if (ok)
        run();
    });
  }
  for (auto& f : started)
    if (auto err = f.get(); err && !start_error_)
      start_error_ = std::move(err);
  if (start_error_) {
    // No task runs on a pool that did not start: every thread stops.
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stopping_ = true;
    }
    cv_.notify_all();
  }
}

worker_pool::~worker_pool() {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void worker_pool::post(std::function<void()> task) {
  if (start_error_)
    return;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void worker_pool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock{mtx_};
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty())
        return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

} // namespace dualpath::transport::storage
