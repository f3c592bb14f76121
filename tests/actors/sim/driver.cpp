// ctest-label: sim
// The simulation driver on small actors: time jumps to the next timeout when
// no job is ready, delayed messages fire in simulated time and in order, a
// run that cannot finish reports `stalled`, the watched actor's CPU time is
// measured, and two runs of the same actors give the same trace of events.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/type_id.hpp>

#include "actors/sim/driver.hpp"

using namespace dualpath::actors;
using namespace std::chrono_literals;

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, driver_test_atoms, tick_atom, "tick")

namespace {

using namespace driver_test_atoms;

struct sim_config : caf::actor_system_config {
  sim_config() {
    set("scheduler.policy", caf::atom("testing"));
  }
};

// A ticker that re-arms itself `n` times with a period of `period` and logs
// (its name, simulated ns since its start) on every tick.
caf::behavior ticker(caf::event_based_actor* self, std::string name,
                     caf::timespan period, int n,
                     std::shared_ptr<std::vector<std::string>> log) {
  auto start = self->clock().now();
  self->delayed_send(self, period, tick_atom_v, 1);
  return {
      [=](tick_atom, int i) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      self->clock().now() - start)
                      .count();
        log->push_back(name + "@" + std::to_string(ns));
        if (i < n)
          self->delayed_send(self, period, tick_atom_v, i + 1);
        else
          self->quit();
      },
  };
}

std::vector<std::string> run_two_tickers() {
  sim_config cfg;
  caf::actor_system sys{cfg};
  auto log = std::make_shared<std::vector<std::string>>();
  auto a = sys.spawn(ticker, std::string{"a"}, caf::timespan{3ms}, 4, log);
  auto b = sys.spawn(ticker, std::string{"b"}, caf::timespan{5ms}, 3, log);
  auto done = [&] { return log->size() == 7; };
  CHECK(sim::run_until(sys, done, 10s) == sim::run_outcome::done);
  return *log;
}

} // namespace

TEST_CASE("real-time systems are not simulated") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  CHECK_FALSE(sim::simulated(sys));
  CHECK(sim::settle(sys) == 0);
}

TEST_CASE("delayed messages fire in simulated time, in time order") {
  auto log = run_two_tickers();
  // a: 3, 6, 9, 12 ms; b: 5, 10, 15 ms, merged by time.
  std::vector<std::string> want{"a@3000000", "b@5000000",  "a@6000000",
                                "a@9000000", "b@10000000", "a@12000000",
                                "b@15000000"};
  CHECK(log == want);
}

TEST_CASE("two runs of the same actors give the same events") {
  CHECK(run_two_tickers() == run_two_tickers());
}

TEST_CASE("a run that cannot finish stalls instead of hanging") {
  sim_config cfg;
  caf::actor_system sys{cfg};
  auto log = std::make_shared<std::vector<std::string>>();
  auto a = sys.spawn(ticker, std::string{"a"}, caf::timespan{1ms}, 2, log);
  auto before = sim::events();
  CHECK(sim::run_until(
            sys, [] { return false; }, 10s)
        == sim::run_outcome::stalled);
  CHECK(log->size() == 2);
  auto after = sim::events();
  CHECK(after.timeouts - before.timeouts >= 2);
  CHECK(after.jobs > before.jobs);
}

TEST_CASE("settle answers a blocking caller without advancing time") {
  sim_config cfg;
  caf::actor_system sys{cfg};
  auto echo = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int x) { return x + 1; }};
  });
  auto* coord = sim::coordinator(sys);
  REQUIRE(coord != nullptr);
  auto t0 = sys.clock().now();
  caf::scoped_actor self{sys};
  auto pending = self->request(echo, caf::infinite, 41);
  CHECK(sim::settle(sys) > 0);
  int got = 0;
  pending.receive([&](int y) { got = y; }, [&](caf::error&) { got = -1; });
  CHECK(got == 42);
  CHECK(sys.clock().now() == t0);
}

TEST_CASE("the watched actor's CPU and wall time are measured") {
  sim_config cfg;
  caf::actor_system sys{cfg};
  auto log = std::make_shared<std::vector<std::string>>();
  auto busy = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->delayed_send(self, caf::timespan{1ms}, tick_atom_v, 0);
    return {[=](tick_atom, int i) {
      // Some real work per message.
      volatile double x = 0;
      for (int k = 0; k < 2'000'000; ++k)
        x = x + k * 0.5;
      if (i < 5)
        self->delayed_send(self, caf::timespan{1ms}, tick_atom_v, i + 1);
      else
        self->quit();
    }};
  });
  sim::watch(busy);
  CHECK(sim::run_until(
            sys, [] { return false; }, 10s)
        == sim::run_outcome::stalled);
  CHECK(sim::watched_cpu_seconds() > 0.001);
  // Wall time covers the CPU time (same jobs; a busy host only adds to it).
  CHECK(sim::watched_wall_seconds() >= sim::watched_cpu_seconds() * 0.9);
  sim::watch(caf::actor{});
  CHECK(sim::watched_cpu_seconds() == 0);
  CHECK(sim::watched_wall_seconds() == 0);
}
