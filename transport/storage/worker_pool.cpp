#include "transport/storage/worker_pool.hpp"

#include <algorithm>
#include <future>
#include <utility>

namespace dualpath::transport::storage {

worker_pool::worker_pool(uint32_t threads, thread_start_hook on_start) {
  std::vector<std::future<caf::error>> started;
  for (uint32_t i = 0; i < threads; ++i) {
    std::promise<caf::error> p;
    started.push_back(p.get_future());
    threads_.emplace_back([q = q_, &on_start, p = std::move(p)]() mutable {
      auto err = on_start ? on_start() : caf::error{};
      bool ok = !err;
      p.set_value(std::move(err)); // `on_start` may end after this call
      if (ok)
        run(*q);
    });
  }
  for (auto& f : started)
    if (auto err = f.get(); err && !start_error_)
      start_error_ = std::move(err);
  if (start_error_) {
    // No task runs on a pool that did not start: every thread stops.
    {
      std::lock_guard<std::mutex> guard{q_->mtx};
      q_->stopping = true;
    }
    q_->cv.notify_all();
  }
}

worker_pool::~worker_pool() {
  {
    std::lock_guard<std::mutex> guard{q_->mtx};
    q_->stopping = true;
  }
  q_->cv.notify_all();
  auto self = std::find_if(threads_.begin(), threads_.end(), [](auto& t) {
    return t.get_id() == std::this_thread::get_id();
  });
  for (auto i = threads_.begin(); i != threads_.end(); ++i)
    if (i != self)
      i->join(); // each runs what is queued before it ends
  if (self == threads_.end())
    return;
  // On one of our own threads, inside a task: what the others left is run
  // here, while what the tasks use still exists; the thread ends when the
  // task that destroyed us returns (its run() holds the queue).
  for (;;) {
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> guard{q_->mtx};
      if (q_->tasks.empty())
        break;
      task = std::move(q_->tasks.front());
      q_->tasks.pop_front();
    }
    task();
  }
  self->detach();
}

void worker_pool::post(std::function<void()> task) {
  if (start_error_)
    return;
  {
    std::lock_guard<std::mutex> guard{q_->mtx};
    q_->tasks.push_back(std::move(task));
  }
  q_->cv.notify_one();
}

void worker_pool::run(queue& q) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock{q.mtx};
      q.cv.wait(lock, [&q] { return q.stopping || !q.tasks.empty(); });
      if (q.tasks.empty())
        return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
    }
    task();
  }
}

} // namespace dualpath::transport::storage
