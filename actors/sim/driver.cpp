#include "actors/sim/driver.hpp"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <map>
#include <typeinfo>
#include <unordered_map>

#include <caf/actor_cast.hpp>
#include <caf/local_actor.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/test_coordinator.hpp>

namespace dualpath::actors::sim {

namespace {

std::atomic<uint64_t> jobs_run{0};
std::atomic<uint64_t> timeouts_fired{0};

// The watched actor (as the coordinator sees it) and its jobs' CPU time.
caf::actor watched_actor;
const caf::resumable* watched_job = nullptr;
std::atomic<int64_t> watched_ns{0};
std::atomic<int64_t> watched_wall_ns{0};

// Jobs per dynamic type of the job, with the actor name of that type (a
// stateful actor's name is its state type's). typeid(*job) is one load; the
// dynamic_cast to local_actor for the name crosses CAF's virtual bases
// (type-name compares) and ran for every job: ~2% of a simulation. Two
// entries with one name (a type seen through two type_info objects) are
// merged by jobs_by_actor().
struct type_jobs {
  const char* name = nullptr;
  uint64_t n = 0;
};
std::unordered_map<const std::type_info*, type_jobs> jobs_per_type;

void count_job(const caf::resumable* job) {
  auto& e = jobs_per_type[&typeid(*job)];
  if (e.name == nullptr) {
    auto* a = dynamic_cast<const caf::local_actor*>(job);
    e.name = a != nullptr ? a->name() : "(not an actor)";
  }
  ++e.n;
}

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

} // namespace

caf::scheduler::test_coordinator* coordinator(caf::actor_system& sys) {
  return dynamic_cast<caf::scheduler::test_coordinator*>(&sys.scheduler());
}

bool simulated(caf::actor_system& sys) {
  return coordinator(sys) != nullptr;
}

uint64_t settle(caf::actor_system& sys) {
  auto* c = coordinator(sys);
  if (c == nullptr)
    return 0;
  uint64_t n = 0;
  while (c->try_run_once())
    ++n;
  jobs_run += n;
  return n;
}

run_outcome run_until(caf::actor_system& sys, const std::function<bool()>& done,
                      std::chrono::steady_clock::duration wall_limit) {
  auto* c = coordinator(sys);
  if (c == nullptr)
    return run_outcome::stalled;
  auto start = std::chrono::steady_clock::now();
  uint64_t jobs = 0;
  uint64_t timeouts = 0;
  auto result = run_outcome::done;
  while (!done()) {
    if (c->has_job())
      count_job(c->jobs.front());
    if (watched_job != nullptr && c->has_job()
        && c->jobs.front() == watched_job) {
      auto w0 = std::chrono::steady_clock::now();
      auto t0 = thread_cpu_ns();
      c->run_once();
      watched_ns += thread_cpu_ns() - t0;
      watched_wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - w0)
                             .count();
      ++jobs;
      continue;
    }
    if (c->try_run_once()) {
      // The wall clock is read every 4096 jobs only: it is not free.
      if ((++jobs & 0xfff) == 0 && wall_limit.count() > 0
          && std::chrono::steady_clock::now() - start > wall_limit) {
        result = run_outcome::wall_limit;
        break;
      }
      continue;
    }
    if (!c->trigger_timeout()) {
      result = done() ? run_outcome::done : run_outcome::stalled;
      break;
    }
    ++timeouts;
  }
  jobs_run += jobs;
  timeouts_fired += timeouts;
  return result;
}

void watch(const caf::actor& actor) {
  watched_actor = actor;
  watched_job = actor ? dynamic_cast<const caf::resumable*>(
                    caf::actor_cast<caf::abstract_actor*>(actor))
                      : nullptr;
  watched_ns = 0;
  watched_wall_ns = 0;
}

double watched_cpu_seconds() {
  return static_cast<double>(watched_ns.load()) / 1e9;
}

double watched_wall_seconds() {
  return static_cast<double>(watched_wall_ns.load()) / 1e9;
}

std::vector<std::pair<std::string, uint64_t>> jobs_by_actor() {
  std::map<std::string, uint64_t> merged; // equal names, other storage
  for (auto& [type, e] : jobs_per_type)
    merged[e.name] += e.n;
  std::vector<std::pair<std::string, uint64_t>> out(merged.begin(),
                                                    merged.end());
  std::stable_sort(out.begin(), out.end(),
                   [](auto& x, auto& y) { return x.second > y.second; });
  return out;
}

void reset_jobs_by_actor() {
  jobs_per_type.clear();
}

event_counts events() {
  return event_counts{jobs_run.load(), timeouts_fired.load()};
}

} // namespace dualpath::actors::sim
