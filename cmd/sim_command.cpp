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
  std::string name() const override {
    return "sim";
  }

  std::string description() const override {
    return "Simulate `run` in simulated time (deterministic, modeled data "
           "plane): cluster scale on one core.";
  }

  void add_options(CLI::App& app, key_flags& flags) override {
    job_.add(app, flags);
  }

  int run(const invocation& inv) override {
    auto& cfg = inv.cfg;
    auto modes = parse_variants(cfg.string("run.modes"));
    if (!modes)
      return inv.fail(name(), caf::to_string(modes.error().context()),
                      exit_usage);
    job_options opts;
    opts.modes = *modes;
    opts.turns = static_cast<uint32_t>(cfg.integer("run.turns"));
    opts.aps = cfg.real("run.aps");
    opts.wall_limit = std::chrono::seconds(cfg.integer("run.wall_limit_s"));
    opts.simulate = true;
    job_.apply(opts, "sim ", 256);
    fixed_mmap_threshold();
    auto parsed = parse_rates(job_.sweep);
    if (!parsed)
      return inv.fail(name(), error_text(parsed.error()), exit_usage);
    auto rates = std::move(*parsed);
    auto res = run_job(cfg, opts);
    if (!res) {
      auto& err = res.error();
      auto bad_input = is_bad_input(err);
      return inv.fail(name(), error_text(err),
                      bad_input ? exit_usage : exit_failure);
    }
    sweep_results sweep;
    for (auto aps : rates) {
      auto o = opts;
      o.aps = aps;
      auto r = run_job(cfg, o);
      if (!r)
        return inv.fail(name(), error_text(r.error()), exit_failure);
      sweep.emplace_back(aps, std::move(*r));
    }
    uint64_t events = 0;
    double replay_wall = 0;
    for (auto& s : res->sim) {
      events += s.events;
      replay_wall += s.wall_s;
    }
    auto events_per_s = replay_wall > 0 ? events / replay_wall : 0.0;
    auto basic = find_mode(res->modes, "basic");
    auto dual = find_mode(res->modes, "dualpath");
    auto oracle = find_mode(res->modes, "oracle");
    if (inv.json()) {
      auto doc = job_json(*res, sweep);
      for (size_t i = 0; i < res->modes.size() && i < res->sim.size(); ++i)
        doc["modes"][res->modes[i].mode]["sim"] =
            sim_json(res->sim[i], res->modes[i].jct_s);
      doc["data_plane"] = "modeled";
      doc["verification"] = not_verified;
      doc["sim_events"] = events;
      doc["sim_events_per_s"] = events_per_s;
      return inv.emit_json(doc);
    }
    auto& out = inv.out;
    out << "dualpath sim: " << res->agents << " agents, "
        << res->requests_per_mode << " requests per mode, mean prompt "
        << std::fixed << std::setprecision(0) << res->mean_prompt_tokens
        << " tokens (" << std::setprecision(1) << res->mean_hit_share * 100
        << "% in storage at the first replayed turn)\n"
        << "model " << cfg.string("model.name") << ", "
        << cfg.integer("run.prefill_nodes") << "P"
        << cfg.integer("run.decode_nodes") << "D x "
        << cfg.integer("hardware.gpus_per_node") << " GPUs ("
        << cfg.string("hardware.profile")
        << "); simulated time, modeled data plane (KV " << not_verified
        << ")\n\n";
    print_table(out, res->modes);
    out << '\n';
    print_bounds(out, res->bounds, res->modes);
    out << std::setprecision(2);
    if (basic && dual)
      out << "\nBasic / DualPath JCT: " << ratio(basic, dual) << "x";
    if (dual && oracle)
      out << "\nDualPath / Oracle JCT: " << ratio(dual, oracle) << "x";
    out << "\n";
    for (size_t i = 0; i < res->sim.size() && i < res->modes.size(); ++i) {
      auto& s = res->sim[i];
      auto jct = res->modes[i].jct_s;
      out << "simulation " << s.mode << ": " << s.events << " events in "
          << std::setprecision(1) << s.wall_s << " s wall ("
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
    out << "wall time: " << std::setprecision(1) << res->wall_s
        << " s (store pre-population " << res->populate_s << " s)\n";
    for (auto& [aps, r] : sweep) {
      out << "\nAPS " << aps << ":\n";
      print_table(out, r.modes);
    }
    if (!sweep.empty()) {
      auto cap = capacity(sweep);
      for (auto& m : sweep.front().second.modes)
        out << "capacity under SLO, " << m.mode << ": "
            << cap.value(m.mode, 0.0) << " APS\n";
    }
    return exit_ok;
  }

private:
  job_flags job_;
};

} // namespace

std::unique_ptr<command> make_sim_command() {
  return std::make_unique<sim_command>();
}

} // namespace dualpath::cmd
