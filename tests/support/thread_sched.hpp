// Test helper: what the kernel says about a thread's scheduling, read back
// on a fresh thread after a function set it (header only).
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/error.hpp>

namespace dualpath::test {

/// A thread after `set` ran on it: set's error, its policy
/// (sched_getscheduler), niceness and name (/proc/self/task/<tid>/comm).
struct thread_view {
  caf::error err;
  int policy = -1;
  int nice = 0;
  std::string comm;
};

/// Runs `set` on a new thread and reads the thread back.
inline thread_view on_new_thread(const std::function<caf::error()>& set) {
  std::promise<thread_view> p;
  std::thread t{[&] {
    thread_view v;
    v.err = set();
    v.policy = ::sched_getscheduler(0);
    auto tid = ::syscall(SYS_gettid);
    v.nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    std::ifstream in{"/proc/self/task/" + std::to_string(tid) + "/comm"};
    std::getline(in, v.comm);
    p.set_value(std::move(v));
  }};
  auto v = p.get_future().get();
  t.join();
  return v;
}

/// The thread ids of this process's threads named `comm` now, from the
/// thread list in /proc/self/task.
inline std::vector<pid_t> tids_named(const std::string& comm) {
  std::vector<pid_t> out;
  for (auto& e : std::filesystem::directory_iterator{"/proc/self/task"}) {
    std::ifstream in{e.path() / "comm"};
    std::string name;
    std::getline(in, name);
    if (name == comm)
      out.push_back(std::stoi(e.path().filename().string()));
  }
  return out;
}

/// How often thread `tid` of this process has gone to sleep so far
/// (voluntary_ctxt_switches in /proc/self/task/<tid>/status; -1 if gone).
inline long voluntary_switches(pid_t tid) {
  std::ifstream in{"/proc/self/task/" + std::to_string(tid) + "/status"};
  for (std::string line; std::getline(in, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
      return std::stol(line.substr(line.find(':') + 1));
  return -1;
}

/// Policy (sched_getscheduler) and niceness of each of this process's
/// threads named `comm` now.
inline std::vector<std::pair<int, int>> threads_now(const std::string& comm) {
  std::vector<std::pair<int, int>> out;
  for (auto tid : tids_named(comm))
    out.emplace_back(::sched_getscheduler(tid),
                     ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid)));
  return out;
}

} // namespace dualpath::test
