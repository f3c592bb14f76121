#include "transport/storage/worker_pool.hpp"

#include <utility>

namespace dualpath::transport::storage {

worker_pool::worker_pool(uint32_t threads) {
  for (uint32_t i = 0; i < threads; ++i)
    threads_.emplace_back([this] { run(); });
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
