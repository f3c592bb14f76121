#include "actors/cluster/replay.hpp"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <random>

#include <caf/all.hpp>
#include <caf/type_id.hpp>

#include "actors/sim/driver.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::cluster::replay_atoms,
             start_agent_atom, "startagent")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::cluster::replay_atoms,
             recorded_atom, "recorded")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::cluster::replay_atoms,
             lag_tick_atom, "lagtick")

namespace dualpath::actors::cluster {

namespace {

using namespace dualpath::actors::cluster::replay_atoms;

// The emulation runs on the wall clock: when the CPUs cannot keep up,
// delayed messages fire late and emulated times stretch. The driver measures
// how late its own periodic timer fires as a health signal for the run.
constexpr auto lag_period = std::chrono::milliseconds(20);

// The driver's and the agents' interfaces (in-process only): an agent is
// told to start; the driver receives each finished turn's record and its
// own lag timer.
using agent_actor = caf::typed_actor<caf::reacts_to<start_agent_atom>>;
using driver_actor =
    caf::typed_actor<caf::reacts_to<recorded_atom, request_record>,
                     caf::reacts_to<lag_tick_atom>>;

// What the driver and its agents share; read-only once the agents run but
// for the id counter.
struct replay_context {
  scheduler::workload::trace trace; // a copy: outlives a timed-out caller
  scheduler_actor scheduler;
  replay_options opts;
  uint64_t id_base = 0;
  std::atomic<uint64_t> next_id{0}; // agents run concurrently in real time
  std::atomic<uint64_t> done{0};    // completed requests, read by replay()
};

// One agent: submits its turns one after another and hands each finished
// turn's record to the driver. An agent is an actor of its own because an
// actor's pending requests live in CAF's unordered_flat_map (a vector,
// searched linearly and shifted on erase): one driver awaiting a reply per
// agent paid O(agents) per reply, ~10% of a 48K-agent simulation.
struct agent_state {
  static inline const char* name = "dualpath.agent";
  std::shared_ptr<replay_context> ctx;
  driver_actor driver;
  const scheduler::workload::trajectory* traj = nullptr;
  uint32_t next_turn = 0;
  /// The agent's ids so far: each turn's prompt is a prefix of the next's, so
  /// a turn appends its new ids and its prompt is a view (token_list.hpp).
  token_sequence ids;
};

using agent_ptr = agent_actor::stateful_pointer<agent_state>;

void submit_next(agent_ptr self) {
  auto& s = self->state;
  auto& ctx = *s.ctx;
  if (s.next_turn >= s.traj->turns.size()) {
    self->quit();
    return;
  }
  auto turn = s.next_turn++;
  request_spec spec;
  spec.id = ctx.next_id.fetch_add(1, std::memory_order_relaxed);
  spec.agent = s.traj->agent;
  spec.turn = turn;
  auto len = scheduler::workload::prompt_length(*s.traj, turn);
  if (s.ids.size() == 0) {
    // Room for the last turn's prompt at once: growing turn by turn moved
    // the ids (and faulted in fresh pages) every few turns, ~5% of a 48K
    // simulation. Pages are touched only as ids are written.
    s.ids.reserve(
        scheduler::workload::prompt_length(*s.traj, s.traj->turns.size() - 1));
  }
  if (s.ids.size() < len) {
    auto n = len - s.ids.size();
    scheduler::workload::tokens_into(*s.traj, s.ids.size(), n, s.ids.extend(n));
    s.ids.commit(n);
  }
  spec.tokens = s.ids.prefix(len);
  spec.gen_tokens = s.traj->turns[turn].gen;
  spec.output_tokens =
      scheduler::workload::tokens(*s.traj, len, spec.gen_tokens);
  if (s.next_turn >= s.traj->turns.size())
    s.ids = token_sequence{}; // the last turn's views keep what they need
  spec.arrival_ns = ctx.opts.time.since_start_ns(self->clock().now());
  auto rec = std::make_shared<request_record>();
  rec->id = spec.id;
  rec->agent = spec.agent;
  rec->turn = turn;
  rec->prompt_tokens = spec.tokens.size();
  rec->gen_tokens = spec.gen_tokens;
  rec->arrival_ns = spec.arrival_ns;
  auto on_end = [self, rec] {
    self->send(self->state.driver, recorded_atom_v, std::move(*rec));
    submit_next(self);
  };
  self->request(ctx.scheduler, caf::infinite, submit_atom_v, std::move(spec))
      .then(
          [rec, on_end](request_result& res) {
            rec->result = std::move(res);
            on_end();
          },
          [self, rec, on_end](caf::error& err) {
            rec->failed = true;
            rec->error = self->system().render(err);
            on_end();
          });
}

agent_actor::behavior_type agent(agent_ptr self,
                                 std::shared_ptr<replay_context> ctx,
                                 driver_actor driver, size_t index) {
  auto& s = self->state;
  s.ctx = std::move(ctx);
  s.driver = std::move(driver);
  s.traj = &s.ctx->trace[index];
  s.next_turn = s.traj->history_turns;
  // Ends with the driver (a timed-out or failed replay). A monitor, not a
  // link: an agent quitting after its last turn then costs the driver
  // nothing (a link's removal walks the driver's list of N attachments).
  self->monitor(s.driver);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  return {
      [self](start_agent_atom) { submit_next(self); },
  };
}

struct driver_state {
  static inline const char* name = "dualpath.replay";
  std::shared_ptr<replay_context> ctx;
  std::vector<agent_actor> agents;
  replay_outcome outcome;
  uint64_t total = 0;
  uint64_t done = 0;
  std::shared_ptr<std::promise<replay_outcome>> result;
  std::chrono::steady_clock::time_point wall_start;
  int64_t start_ns = 0;  // emulated time of the replay's start
  int64_t latest_ns = 0; // the latest completion so far, since the start
  std::chrono::steady_clock::time_point tick_due;
  std::vector<double> lag_ms; // how late each timer tick fired
};

using driver_ptr = driver_actor::stateful_pointer<driver_state>;

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
  auto ctx = std::make_shared<replay_context>();
  ctx->trace = trace;
  ctx->scheduler = scheduler;
  ctx->opts = opts;
  ctx->id_base = id_base;
  ctx->next_id = id_base;
  auto driver = sys.spawn([ctx, result, total](
                              driver_ptr self) -> driver_actor::behavior_type {
    auto& s = self->state;
    auto& opts = ctx->opts;
    s.ctx = ctx;
    s.result = result;
    s.total = total;
    s.outcome.records.resize(total);
    s.wall_start = std::chrono::steady_clock::now();
    s.start_ns = opts.time.since_start_ns(self->clock().now());
    auto me = caf::actor_cast<driver_actor>(self);
    for (size_t i = 0; i < ctx->trace.size(); ++i)
      if (ctx->trace[i].turns.size() > ctx->trace[i].history_turns)
        s.agents.push_back(self->spawn(agent, ctx, me, i));
    // Offline: everyone now. Online: Poisson arrivals in emulated time.
    std::mt19937_64 rng{opts.seed};
    std::exponential_distribution<double> gap{opts.aps > 0 ? opts.aps : 1.0};
    double at_s = 0;
    for (auto& a : s.agents) {
      if (opts.aps <= 0) {
        self->send(a, start_agent_atom_v);
        continue;
      }
      at_s += gap(rng);
      auto delay = opts.time.to_actor(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(at_s)));
      self->delayed_send(a, delay, start_agent_atom_v);
    }
    s.agents.clear(); // they quit after their last turn
    // Health signal (wall clock only; simulated timers are never late): a
    // periodic timer's lateness, sampled until the replay ends.
    auto arm_tick = [self] {
      self->state.tick_due = std::chrono::steady_clock::now() + lag_period;
      self->delayed_send(self, lag_period, lag_tick_atom_v);
    };
    if (!sim::simulated(self->system()))
      arm_tick();
    return {
        [self](recorded_atom, request_record& rec) {
          auto& s = self->state;
          auto index = rec.id - s.ctx->id_base;
          s.latest_ns = std::max(s.latest_ns, rec.result.done_ns - s.start_ns);
          if (index < s.outcome.records.size())
            s.outcome.records[index] = std::move(rec);
          ++s.done;
          s.ctx->done.store(s.done, std::memory_order_relaxed);
          if (s.ctx->opts.progress)
            s.ctx->opts.progress(s.done, s.total,
                                 static_cast<double>(s.latest_ns) / 1e9);
          if (s.done == s.total)
            finish(self);
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
  } else {
    // Real time: wait for the driver, asking `watch` between waits whether
    // the job can still finish.
    using clock = std::chrono::steady_clock;
    auto deadline = opts.wall_limit.count() > 0 ? clock::now() + opts.wall_limit
                                                : clock::time_point::max();
    auto period =
        opts.watch ? opts.watch_period : std::chrono::milliseconds(500);
    for (;;) {
      auto now = clock::now();
      if (now >= deadline) {
        if (fut.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
          break;
        caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
        return caf::make_error(caf::sec::request_timeout,
                               "trace replay did not finish within "
                                   + std::to_string(opts.wall_limit.count())
                                   + " s of wall-clock time");
      }
      auto wait = std::min<clock::duration>(period, deadline - now);
      if (fut.wait_for(wait) == std::future_status::ready)
        break;
      if (!opts.watch)
        continue;
      auto why = opts.watch();
      if (!why
          || fut.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
        continue;
      caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
      auto reason = why.context().match_elements<std::string>()
                        ? why.context().get_as<std::string>(0)
                        : sys.render(why);
      return caf::make_error(caf::sec::runtime_error,
                             reason + " (" + std::to_string(ctx->done.load())
                                 + " of " + std::to_string(total)
                                 + " requests completed)");
    }
  }
  return fut.get();
}

} // namespace dualpath::actors::cluster
