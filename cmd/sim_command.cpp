// `dualpath sim`: the actors of `dualpath run` (embedded cluster, scheduler,
// engines, replay driver) in simulated time under CAF's deterministic
// scheduler, with a modeled data plane (no KV byte moves; link, storage-NIC
// and compute times as in `run`). Same options and the same report as `run`,
// plus what the simulation cost: events, events per wall second and the
// scheduler actor's CPU time per simulated second. docs/simulation.md.
#include <cstdio>
#ifdef __GLIBC__
#  include <malloc.h>
#endif
#include <iomanip>
#include <iostream>
#include <sstream>

#include "actors/cluster/job.hpp"
#include "actors/protocol/register.hpp"
#include "cmd/command.hpp"
#include "cmd/job_report.hpp"

namespace dualpath::cmd {

namespace {

// A simulation allocates and frees prompt-sized buffers (token ids: ~120 KB
// per agentic prompt) by the hundred thousand. glibc serves them from mmap
// until the first is freed, then raises its mmap threshold past them and
// carves them from the heap, whose free lists fragment: mid-sized
// allocations then search them (_int_malloc was up to 17% of a 48P96D run).
// A fixed threshold keeps them mapped. Measured at 48P96D, 12,288 agents x
// 20 turns, the two runs side by side: 144.5 -> 129.3 s, max RSS 2.73 ->
// 2.62 GB (docs/simulation.md, Speed). Past glibc's M_MMAP_MAX (65,536 live
// mappings: ~60 K agents) further buffers come from the heap again.
void fixed_mmap_threshold() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
#endif
}

using namespace actors::cluster;

constexpr const char* not_verified = "not verified: simulated data plane";

// The simulation's cost of one mode as JSON.
nlohmann::json sim_json(const sim_mode_stats& s, double jct_s) {
  auto links = nlohmann::json::object();
  for (auto& l : s.links)
    links[l.link] = {{"mean_util", l.mean_util}, {"max_util", l.max_util}};
  auto by_actor = nlohmann::json::object();
  for (auto& [actor, n] : s.jobs_by_actor)
    by_actor[actor] = n;
  return {{"links", links},
          {"events_by_actor", by_actor},
          {"events", s.events},
          {"timeouts", s.timeouts},
          {"wall_s", s.wall_s},
          {"events_per_s", s.wall_s > 0 ? s.events / s.wall_s : 0.0},
          {"scheduler_cpu_s", s.scheduler_cpu_s},
          {"scheduler_wall_s", s.scheduler_wall_s},
          // CPU seconds per simulated second = cores the scheduler needs.
          {"scheduler_cores", jct_s > 0 ? s.scheduler_cpu_s / jct_s : 0.0}};
}

class sim_command : public command {
public:
  sim_command()
      : command("sim",
                "Simulate `run` in simulated time (deterministic, modeled data "
                "plane): cluster scale on one core.") {
  }

  void add_options(CLI::App& app, key_flags& flags) override {
    job_.add(app, flags);
  }

  int run(const invocation& inv) override {
    auto& cfg = inv.cfg;
    auto plan = plan_job(cfg, job_, name(), job_clock::simulated);
    if (!plan)
      return inv.fail(name(), error_text(plan.error()), exit_usage);
    auto& opts = plan->opts;
    fixed_mmap_threshold();
    auto res = run_job(cfg, opts);
    if (!res)
      return fail_job(inv, name(), res.error());
    auto swept = run_sweep(cfg, opts, plan->rates);
    if (!swept)
      return inv.fail(name(), error_text(swept.error()), exit_failure);
    auto& sweep = *swept;
    uint64_t events = 0;
    double replay_wall = 0;
    for (auto& s : res->sim) {
      events += s.events;
      replay_wall += s.wall_s;
    }
    auto events_per_s = replay_wall > 0 ? events / replay_wall : 0.0;
    if (inv.json()) {
      auto doc = job_json(*res, sweep);
      for (size_t i = 0; i < res->modes.size() && i < res->sim.size(); ++i)
        doc["modes"][res->modes[i].mode]["sim"] =
            sim_json(res->sim[i], res->modes[i].jct_s);
      doc["data_plane"] = "modeled";
      doc["verification"] = not_verified;
      doc["sim_events"] = events;
      doc["sim_events_per_s"] = events_per_s;
      if (auto rc = inv.emit_json(doc); rc != exit_ok)
        return rc;
    }
    // The report goes to stdout unless the JSON does, as with `run`.
    if (!inv.json_on_stdout())
      print_text(inv.out, *res, sweep, opts, cfg);
    if (!job_.plot_dir.empty())
      if (auto err = write_plots(job_.plot_dir, *res, sweep))
        return inv.fail(name(), error_text(err), exit_failure);
    return exit_ok;
  }

private:
  void print_text(std::ostream& out, const job_result& res,
                  const sweep_results& sweep, const job_options& opts,
                  const config::settings& cfg) const {
    print_report_head(out, name(), res, opts, embedded_shape(cfg),
                      std::string{"simulated time, modeled data plane (KV "}
                          + not_verified + ")",
                      reroute_row::hide);
    for (size_t i = 0; i < res.sim.size() && i < res.modes.size(); ++i) {
      auto& s = res.sim[i];
      auto jct = res.modes[i].jct_s;
      out << std::fixed << "simulation " << s.mode << ": " << s.events
          << " events in " << std::setprecision(1) << s.wall_s << " s wall ("
          << std::setprecision(0) << (s.wall_s > 0 ? s.events / s.wall_s : 0)
          << " events/s); scheduler " << std::setprecision(3)
          << s.scheduler_cpu_s << " CPU s (" << s.scheduler_wall_s
          << " s wall) = " << (jct > 0 ? s.scheduler_cpu_s / jct : 0)
          << " cores per simulated second\n";
      if (!s.links.empty()) {
        out << "  link utilisation over the JCT, mean / max:";
        for (auto& l : s.links)
          out << ' ' << l.link << ' ' << std::setprecision(2) << l.mean_util
              << '/' << l.max_util;
        out << '\n';
      }
    }
    print_report_tail(out, res, sweep);
  }

  job_flags job_;
};

} // namespace

std::unique_ptr<command> make_sim_command() {
  return std::make_unique<sim_command>();
}

} // namespace dualpath::cmd
