#include "actors/cluster/replay.hpp"

#include <algorithm>
#include <future>
#include <map>
#include <random>

#include <caf/all.hpp>

#include "actors/sim/driver.hpp"

namespace dualpath::actors::cluster {

namespace {

using start_agent_atom = caf::atom_constant<caf::atom("startagent")>;
using lag_tick_atom = caf::atom_constant<caf::atom("lagtick")>;

// The emulation runs on the wall clock: when the CPUs cannot keep up,
// delayed messages fire late and emulated times stretch. The driver measures
// how late its own periodic timer fires as a health signal for the run.
constexpr auto lag_period = std::chrono::milliseconds(20);

struct agent_cursor {
  const scheduler::workload::trajectory* traj = nullptr;
  uint32_t next_turn = 0;
  /// The agent's ids so far: each turn's prompt is a prefix of the next's, so
  /// a turn appends its new ids and its prompt is a view (token_list.hpp).
  token_sequence ids;
};

struct driver_state {
  static inline const char* name = "dualpath.replay";
  scheduler::workload::trace trace; // a copy: outlives a timed-out caller
  std::vector<agent_cursor> agents;
  replay_outcome outcome;
  uint64_t total = 0;
  uint64_t done = 0;
  uint64_t next_id = 0;
  std::shared_ptr<std::promise<replay_outcome>> result;
  std::chrono::steady_clock::time_point wall_start;
  int64_t start_ns = 0; // emulated time of the replay's start
  std::chrono::steady_clock::time_point tick_due;
  std::vector<double> lag_ms; // how late each timer tick fired
};

using driver_ptr = caf::stateful_actor<driver_state>*;

void finish(driver_ptr self) {
  auto& s = self->state;
  std::map<uint64_t, int64_t> agent_done; // by agent id
  for (auto& r : s.outcome.records) {
    auto t = r.result.done_ns - s.start_ns;
    s.outcome.jct_ns = std::max(s.outcome.jct_ns, t);
    auto& a = agent_done[r.agent];
    a = std::max(a, t);
  }
  for (auto& kv : agent_done)
    s.outcome.agent_done_ns.push_back(kv.second);
  if (!s.lag_ms.empty()) {
    std::sort(s.lag_ms.begin(), s.lag_ms.end());
    s.outcome.lag_p99_ms = s.lag_ms[(s.lag_ms.size() * 99) / 100];
    s.outcome.lag_max_ms = s.lag_ms.back();
  }
  s.outcome.wall_s = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - s.wall_start)
                         .count();
  s.result->set_value(std::move(s.outcome));
  self->quit();
}

void submit_next(driver_ptr self, const scheduler_actor& scheduler,
                 const replay_options& opts, size_t agent_index) {
  auto& s = self->state;
  auto& a = s.agents[agent_index];
  if (a.next_turn >= a.traj->turns.size())
    return;
  auto turn = a.next_turn++;
  request_spec spec;
  spec.id = s.next_id++;
  spec.agent = a.traj->agent;
  spec.turn = turn;
  auto len = scheduler::workload::prompt_length(*a.traj, turn);
  if (a.ids.size() < len) {
    auto n = len - a.ids.size();
    scheduler::workload::tokens_into(*a.traj, a.ids.size(), n, a.ids.extend(n));
    a.ids.commit(n);
  }
  spec.tokens = a.ids.prefix(len);
  spec.gen_tokens = a.traj->turns[turn].gen;
  spec.output_tokens =
      scheduler::workload::tokens(*a.traj, len, spec.gen_tokens);
  if (a.next_turn >= a.traj->turns.size())
    a.ids = token_sequence{}; // the last turn's views keep what they need
  spec.arrival_ns = opts.time.since_start_ns(self->clock().now());
  auto index = s.outcome.records.size();
  request_record rec;
  rec.agent = spec.agent;
  rec.turn = turn;
  rec.prompt_tokens = spec.tokens.size();
  rec.gen_tokens = spec.gen_tokens;
  rec.arrival_ns = spec.arrival_ns;
  s.outcome.records.push_back(std::move(rec));
  auto on_end = [self, scheduler, opts, agent_index] {
    auto& s = self->state;
    ++s.done;
    if (opts.progress)
      opts.progress(s.done, s.total);
    if (s.done == s.total)
      finish(self);
    else
      submit_next(self, scheduler, opts, agent_index);
  };
  self->request(scheduler, caf::infinite, submit_atom_v, std::move(spec))
      .then(
          [self, index, on_end](request_result& res) {
            self->state.outcome.records[index].result = std::move(res);
            on_end();
          },
          [self, index, on_end](caf::error& err) {
            auto& rec = self->state.outcome.records[index];
            rec.failed = true;
            rec.error = self->system().render(err);
            on_end();
          });
}

} // namespace

caf::expected<replay_outcome> replay(caf::actor_system& sys,
                                     const scheduler_actor& scheduler,
                                     const scheduler::workload::trace& trace,
                                     const replay_options& opts,
                                     uint64_t id_base) {
  auto result = std::make_shared<std::promise<replay_outcome>>();
  auto fut = result->get_future();
  uint64_t total = 0;
  for (auto& t : trace)
    if (t.turns.size() > t.history_turns)
      total += t.turns.size() - t.history_turns;
  if (total == 0)
    return replay_outcome{};
  auto driver = sys.spawn([trace, scheduler, opts, result, total,
                           id_base](driver_ptr self) -> caf::behavior {
    auto& s = self->state;
    s.trace = trace;
    s.result = result;
    s.total = total;
    s.next_id = id_base;
    s.wall_start = std::chrono::steady_clock::now();
    s.start_ns = opts.time.since_start_ns(self->clock().now());
    for (auto& t : s.trace)
      if (t.turns.size() > t.history_turns)
        s.agents.push_back(agent_cursor{&t, t.history_turns, {}});
    // Offline: everyone now. Online: Poisson arrivals in emulated time.
    std::mt19937_64 rng{opts.seed};
    std::exponential_distribution<double> gap{opts.aps > 0 ? opts.aps : 1.0};
    double at_s = 0;
    for (size_t i = 0; i < s.agents.size(); ++i) {
      if (opts.aps <= 0) {
        self->send(self, start_agent_atom::value, uint64_t{i});
        continue;
      }
      at_s += gap(rng);
      auto delay = opts.time.to_actor(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(at_s)));
      self->delayed_send(self, delay, start_agent_atom::value, uint64_t{i});
    }
    // Health signal (wall clock only; simulated timers are never late): a
    // periodic timer's lateness, sampled until the replay ends.
    auto arm_tick = [self] {
      self->state.tick_due = std::chrono::steady_clock::now() + lag_period;
      self->delayed_send(self, lag_period, lag_tick_atom::value);
    };
    if (!sim::simulated(self->system()))
      arm_tick();
    return {
        [self, scheduler, opts](start_agent_atom, uint64_t i) {
          submit_next(self, scheduler, opts, i);
        },
        [self, arm_tick](lag_tick_atom) {
          auto& s = self->state;
          auto late = std::chrono::steady_clock::now() - s.tick_due;
          s.lag_ms.push_back(std::max(
              0.0, std::chrono::duration<double, std::milli>(late).count()));
          if (s.done < s.total)
            arm_tick();
        },
    };
  });
  if (sim::simulated(sys)) {
    // Simulated time: this thread runs the actors until the driver is done.
    auto ready = [&fut] {
      return fut.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    };
    auto how = sim::run_until(sys, ready, opts.wall_limit);
    if (how != sim::run_outcome::done) {
      caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
      sim::settle(sys);
      return caf::make_error(
          how == sim::run_outcome::stalled ? caf::sec::runtime_error
                                           : caf::sec::request_timeout,
          how == sim::run_outcome::stalled
              ? std::string{"the simulation stalled: no event is left but "
                            "requests are still open"}
              : "trace replay did not finish within "
                    + std::to_string(opts.wall_limit.count())
                    + " s of wall-clock time");
    }
  } else if (opts.wall_limit.count() > 0
             && fut.wait_for(opts.wall_limit) != std::future_status::ready) {
    caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
    return caf::make_error(caf::sec::request_timeout,
                           "trace replay did not finish within "
                               + std::to_string(opts.wall_limit.count())
                               + " s of wall-clock time");
  }
  return fut.get();
}

} // namespace dualpath::actors::cluster
