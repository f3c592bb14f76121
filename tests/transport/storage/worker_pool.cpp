// ctest-label: storage
// The worker pool's start hook: it runs on every thread before any task (the
// tasks see what it set: here the thread's name and SCHED_IDLE, as a node's
// KV I/O threads get them), the constructor returns only once every thread
// has run it, and a failing hook stops the pool: its error is kept and no
// task runs; a pool its own task destroys runs the rest and ends.
#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/sec.hpp>

#include "transport/storage/worker_pool.hpp"

using dualpath::transport::storage::worker_pool;

namespace {

std::string thread_name() {
  char buf[16] = {};
  ::pthread_getname_np(::pthread_self(), buf, sizeof(buf));
  return buf;
}

} // namespace

TEST_CASE("every thread runs the start hook before its first task") {
  std::atomic<int> started{0};
  worker_pool pool{3, [&started] {
                     ::pthread_setname_np(::pthread_self(), "dp-test-io");
                     sched_param p{};
                     ::sched_setscheduler(0, SCHED_IDLE, &p);
                     ++started;
                     return caf::error{};
                   }};
  // The constructor waited for all three.
  CHECK(started.load() == 3);
  CHECK(!pool.start_error());
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<std::string> names;
  std::vector<int> policies;
  const int tasks = 12;
  for (int i = 0; i < tasks; ++i)
    pool.post([&] {
      std::lock_guard<std::mutex> guard{mtx};
      names.push_back(thread_name());
      policies.push_back(::sched_getscheduler(0));
      cv.notify_all();
    });
  std::unique_lock<std::mutex> lock{mtx};
  cv.wait(lock, [&] { return names.size() == tasks; });
  for (int i = 0; i < tasks; ++i) {
    CHECK(names[i] == "dp-test-io");
    CHECK(policies[i] == SCHED_IDLE);
  }
}

TEST_CASE("a pool without a hook runs its tasks as before") {
  std::atomic<int> ran{0};
  {
    worker_pool pool{2};
    CHECK(!pool.start_error());
    for (int i = 0; i < 5; ++i)
      pool.post([&ran] { ++ran; });
  } // the destructor runs every task posted
  CHECK(ran.load() == 5);
}

TEST_CASE("a failing start hook stops the pool with its error") {
  std::atomic<int> calls{0};
  std::atomic<int> ran{0};
  {
    worker_pool pool{4, [&calls]() -> caf::error {
                       // The second thread fails; the others succeed.
                       if (++calls == 2)
                         return caf::make_error(caf::sec::runtime_error,
                                                "sched_setscheduler: EPERM");
                       return caf::none;
                     }};
    CHECK(calls.load() == 4);
    REQUIRE(pool.start_error());
    CHECK(caf::to_string(pool.start_error()).find("EPERM")
          != std::string::npos);
    pool.post([&ran] { ++ran; });
  }
  CHECK(ran.load() == 0);
}

TEST_CASE("a pool destroyed by one of its own tasks runs the rest, then ends") {
  // As when a storage reader's last reference goes with a task's end: the
  // destructor runs on a pool thread, which cannot join itself.
  std::atomic<int> ran{0};
  std::promise<void> destroyed;
  auto pool = std::make_unique<worker_pool>(2);
  auto* raw = pool.get();
  std::mutex gate;
  gate.lock(); // nothing runs until every task is queued
  raw->post([&] {
    { std::lock_guard<std::mutex> hold{gate}; }
    pool.reset();
    destroyed.set_value();
  });
  for (int i = 0; i < 8; ++i)
    raw->post([&] {
      std::lock_guard<std::mutex> hold{gate};
      ++ran;
    });
  gate.unlock();
  REQUIRE(destroyed.get_future().wait_for(std::chrono::seconds{10})
          == std::future_status::ready);
  // Every task posted ran before the destructor returned.
  CHECK(ran.load() == 8);
}
