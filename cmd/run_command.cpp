// `dualpath run`: replays an agentic trace on an embedded emulated cluster in
// each mode (Basic, DualPath, Oracle by default; the ablation adds the
// layerwise-only step) and prints them side by side, with the ratios and a
// verdict, as a table or JSON, and optionally as plots (cmd/plots.hpp).
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "actors/cluster/job.hpp"
#include "actors/node/cluster_file.hpp"
#include "actors/node/node_runtime.hpp"
#include "actors/protocol/register.hpp"
#include "cmd/command.hpp"
#include "cmd/job_report.hpp"

namespace dualpath::cmd {

namespace {

using namespace actors::cluster;

class run_command : public command {
public:
  std::string name() const override {
    return "run";
  }

  std::string description() const override {
    return "Replay an agentic trace on an embedded emulated cluster: Basic vs "
           "DualPath vs Oracle side by side.";
  }

  void add_options(CLI::App& app, key_flags& flags) override {
    job_.add(app, flags);
    flags.add(app, "--store-dir", "storage.dir");
    flags.add(app, "--metrics-port", "observe.metrics_port");
    app.add_option("--cluster", cluster_file_,
                   "Drive a running deployment (`dualpath node` processes "
                   "of this cluster file) instead of an embedded cluster: "
                   "the deployment's one mode, same report.")
        ->type_name("FILE");
  }

  /// The main job: the paper's DS 27B P/D sweep at 1P2D (decode nodes'
  /// storage NICs idle under Basic), as one GPU of each of its 8-GPU nodes
  /// so that two cores emulate it in real time (config/profiles.cpp,
  /// paper-hopper-slice8). A driven deployment takes its nodes' settings.
  std::vector<config::override_entry> defaults() const override {
    if (!cluster_file_.empty())
      return {};
    std::vector<config::override_entry> out;
    for (auto kv :
         {"hardware.profile=paper-hopper-slice8", "model.profile=ds-27b",
          "run.prefill_nodes=1", "run.decode_nodes=2", "workload.agents=96"})
      out.emplace_back(kv, "dualpath run");
    return out;
  }

  int run(const invocation& inv) override {
    auto& cfg = inv.cfg;
    auto plan = plan_job(cfg, job_, name(), job_clock::real);
    if (!plan)
      return inv.fail(name(), error_text(plan.error()), exit_usage);
    auto& opts = plan->opts;
    auto& rates = plan->rates;
    // The GPU plan and what the engines report once (the rank -> device
    // map, GPU memory staged through host memory), as they happen, also
    // with --quiet: they say where the KV really lived.
    opts.notice = [&err = inv.err](const std::string& line) {
      err << "dualpath run: " << line << std::endl;
    };
    caf::expected<job_result> res{job_result{}};
    auto where = embedded_shape(cfg);
    if (!cluster_file_.empty()) {
      auto cf = actors::node::load_cluster(cluster_file_);
      if (!cf)
        return inv.fail(name(), error_text(cf.error()), exit_usage);
      if (!rates.empty())
        return inv.fail(name(), "--aps-sweep is not available with --cluster",
                        exit_usage);
      where = deployment_shape(cfg, *cf);
      res = actors::node::run_cluster_job(cfg, *cf, opts, inv.err);
    } else {
      res = run_job(cfg, opts);
    }
    if (!res) {
      auto& err = res.error();
      // Bad configuration or a bad trace file is bad input (2); anything
      // else is a failed run (1).
      auto bad_input = is_bad_input(err);
      auto status = bad_input ? exit_usage : exit_failure;
      return inv.fail(name(), error_text(err), status);
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
    if (inv.json()) {
      auto doc = job_json(*res, sweep);
      doc["gpu"] = {{"backend", gpu::to_string(res->gpus.kind)},
                    {"devices", res->gpus.devices},
                    {"reason", res->gpus.reason}};
      doc["notices"] = res->notices;
      if (auto rc = inv.emit_json(doc); rc != exit_ok)
        return rc;
    }
    // The table goes to stdout unless the JSON does.
    if (!inv.json_on_stdout()) {
      auto& out = inv.out;
      std::ostringstream plane;
      plane << "real time and real bytes, every KV block verified "
               "byte-exact; time scale "
            << res->time_scale << " (emulated s per wall s), byte scale "
            << res->byte_scale << " (nominal bytes per real byte)";
      print_report_head(out, name(), *res, opts, where, plane.str(),
                        cluster_file_.empty() ? reroute_row::hide
                                              : reroute_row::show);
      out << std::fixed << std::setprecision(1);
      for (auto& m : res->modes)
        if (m.lag_p99_ms * res->time_scale > 50)
          out << "warning: in mode " << m.mode << " timers fired "
              << m.lag_p99_ms
              << " ms late (p99, wall) = " << m.lag_p99_ms * res->time_scale
              << " ms emulated: the CPUs did not keep up and emulated times "
                 "are stretched; "
              << (res->time_scale > 1 ? "use a lower --time-scale or a "
                                        "larger --byte-scale"
                                      : "use a larger --byte-scale or "
                                        "fewer --agents")
              << "\n";
      print_report_tail(out, *res, sweep);
    }
    if (!job_.plot_dir.empty())
      if (auto err = write_plots(job_.plot_dir, *res, sweep))
        return inv.fail(name(), error_text(err), exit_failure);
    if (!res->failures.empty()) {
      for (auto& f : res->failures)
        inv.err << "dualpath run: KV verification failed in mode " << f.mode
                << ": request " << f.request << " (agent " << f.agent
                << ", turn " << f.turn << "), " << f.blocks
                << " block(s) differ from storage\n";
      return exit_failure;
    }
    return exit_ok;
  }

private:
  // "1P1D x 2 GPUs of cluster file F (a running deployment)": the shape of
  // the deployment the job drives, not of run.prefill_nodes/decode_nodes.
  static std::string deployment_shape(const config::settings& cfg,
                                      const actors::node::cluster_file& cf) {
    auto pe = cf.names_of(actors::node::node_role::prefill);
    auto de = cf.names_of(actors::node::node_role::decode);
    size_t gpus = 0;
    for (auto& n : cf.nodes)
      if (n.role != actors::node::node_role::scheduler)
        gpus = std::max(gpus, n.gpus.size());
    return cfg.string("model.name") + " on a running deployment of "
           + std::to_string(pe.size()) + "P" + std::to_string(de.size())
           + "D x " + std::to_string(gpus) + " GPUs ("
           + cfg.string("hardware.profile") + " hardware)";
  }

  job_flags job_;
  std::string cluster_file_;
};

} // namespace

std::unique_ptr<command> make_run_command() {
  return std::make_unique<run_command>();
}

} // namespace dualpath::cmd
