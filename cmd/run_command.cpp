// `dualpath run`: replays an agentic trace on an embedded emulated cluster in
// each mode (Basic, DualPath, Oracle by default; the ablation adds the
// layerwise-only step) and prints them side by side, with the ratios, as a
// table or JSON, and optionally as plots (gnuplot).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

// Writes data files and a gnuplot script into `dir`, then runs gnuplot.
std::string
write_plots(const std::string& dir, const job_result& res,
            const std::vector<std::pair<double, job_result>>& sweep) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return "cannot create " + dir + ": " + ec.message();
  {
    std::ofstream jct{dir + "/jct.dat"};
    for (auto& m : res.modes)
      jct << m.mode << ' ' << m.jct_s << '\n';
  }
  std::ofstream gp{dir + "/plots.gnuplot"};
  gp << "set terminal pngcairo size 900,500\n"
     << "set output '" << dir << "/jct.png'\n"
     << "set title 'Job completion time per mode'\nset ylabel 'JCT (s)'\n"
     << "set style fill solid 0.6\nset boxwidth 0.6\nset yrange [0:*]\n"
     << "plot '" << dir << "/jct.dat' using 0:2:xtic(1) with boxes notitle\n";
  for (auto& tl : res.timelines) {
    auto data = dir + "/snic_" + tl.mode + ".dat";
    std::ofstream out{data};
    // Utilisation between consecutive samples, per node.
    for (size_t i = 1; i < tl.samples.size(); ++i) {
      auto& a = tl.samples[i - 1];
      auto& b = tl.samples[i];
      auto dt = b.t_s - a.t_s;
      if (dt <= 0)
        continue;
      out << b.t_s;
      for (size_t n = 0; n < tl.nodes.size(); ++n) {
        auto rate = static_cast<double>(tl.rates[n]);
        auto u = rate > 0 ? static_cast<double>(b.bytes[n] - a.bytes[n])
                                / (rate * dt)
                          : 0;
        out << ' ' << u;
      }
      out << '\n';
    }
    gp << "set output '" << dir << "/snic_" << tl.mode << ".png'\n"
       << "set title 'Storage-NIC utilisation over time: " << tl.mode << "'\n"
       << "set xlabel 'emulated time (s)'\nset ylabel 'utilisation'\n"
       << "set yrange [0:1.1]\nplot ";
    for (size_t n = 0; n < tl.nodes.size(); ++n)
      gp << (n ? ", " : "") << "'" << data << "' using 1:" << n + 2
         << " with lines title '" << tl.nodes[n] << "'";
    gp << "\n";
  }
  if (!sweep.empty()) {
    std::ofstream out{dir + "/ttft_aps.dat"};
    for (auto& [aps, r] : sweep) {
      out << aps;
      for (auto& m : r.modes)
        out << ' ' << m.ttft_p50_s;
      out << '\n';
    }
    gp << "set output '" << dir << "/ttft_aps.png'\n"
       << "set title 'TTFT p50 against agent arrival rate'\n"
       << "set xlabel 'agents per second'\nset ylabel 'TTFT p50 (s)'\n"
       << "set yrange [0:*]\nplot ";
    auto& modes = sweep.front().second.modes;
    for (size_t i = 0; i < modes.size(); ++i)
      gp << (i ? ", " : "") << "'" << dir << "/ttft_aps.dat' using 1:" << i + 2
         << " with linespoints title '" << modes[i].mode << "'";
    gp << "\n";
  }
  gp.close();
  auto cmd = "gnuplot '" + dir + "/plots.gnuplot' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return "gnuplot failed on " + dir + "/plots.gnuplot";
  return {};
}

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
    app.add_option("--plot-dir", plot_dir_,
                   "Write PNG plots (gnuplot) and their data here.")
        ->type_name("DIR");
    flags.add(app, "--trace", "observe.trace_file");
    flags.add(app, "--metrics-port", "observe.metrics_port");
    app.add_option("--cluster", cluster_file_,
                   "Drive a running deployment (`dualpath node` processes "
                   "of this cluster file) instead of an embedded cluster: "
                   "the deployment's one mode, same report.")
        ->type_name("FILE");
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
    job_.apply(opts, "", 16);
    // The GPU plan and what the engines report once (the rank -> device
    // map, GPU memory staged through host memory), as they happen, also
    // with --quiet: they say where the KV really lived.
    opts.notice = [&err = inv.err](const std::string& line) {
      err << "dualpath run: " << line << std::endl;
    };
    auto parsed = parse_rates(job_.sweep);
    if (!parsed)
      return inv.fail(name(), error_text(parsed.error()), exit_usage);
    auto rates = std::move(*parsed);
    caf::expected<job_result> res{job_result{}};
    if (!cluster_file_.empty()) {
      auto cf = actors::node::load_cluster(cluster_file_);
      if (!cf)
        return inv.fail(name(), error_text(cf.error()), exit_usage);
      if (!rates.empty())
        return inv.fail(name(), "--aps-sweep is not available with --cluster",
                        exit_usage);
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
    auto basic = find_mode(res->modes, "basic");
    auto dual = find_mode(res->modes, "dualpath");
    auto oracle = find_mode(res->modes, "oracle");
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
    if (!inv.json() || !inv.json_file->empty()) {
      auto& out = inv.out;
      out << "dualpath run: " << res->agents << " agents, "
          << res->requests_per_mode << " requests per mode, mean prompt "
          << std::fixed << std::setprecision(0) << res->mean_prompt_tokens
          << " tokens (" << std::setprecision(1) << res->mean_hit_share * 100
          << "% in storage at the first replayed turn)\n"
          << "model " << cfg.string("model.name") << ", "
          << cfg.integer("run.prefill_nodes") << "P"
          << cfg.integer("run.decode_nodes") << "D x "
          << cfg.integer("hardware.gpus_per_node") << " GPUs ("
          << cfg.string("hardware.profile") << "); time scale "
          << res->time_scale << " (emulated s per wall s), byte scale "
          << res->byte_scale << " (nominal bytes per real byte)\n\n";
      print_table(out, res->modes);
      out << '\n';
      print_bounds(out, res->bounds, res->modes);
      out << std::setprecision(2);
      if (basic && dual)
        out << "\nBasic / DualPath JCT: " << ratio(basic, dual) << "x";
      if (dual && oracle)
        out << "\nDualPath / Oracle JCT: " << ratio(dual, oracle) << "x";
      for (auto& m : res->modes)
        if (m.lag_p99_ms * res->time_scale > 50)
          out << "\nwarning: in mode " << m.mode << " timers fired "
              << m.lag_p99_ms
              << " ms late (p99, wall) = " << m.lag_p99_ms * res->time_scale
              << " ms emulated: the CPUs did not keep up and emulated times "
                 "are stretched; use a lower --time-scale or a larger "
                 "--byte-scale";
      out << "\nwall time: " << std::setprecision(1) << res->wall_s
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
    }
    if (!plot_dir_.empty())
      if (auto why = write_plots(plot_dir_, *res, sweep); !why.empty())
        return inv.fail(name(), why, exit_failure);
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
  job_flags job_;
  std::string plot_dir_;
  std::string cluster_file_;
};

} // namespace

std::unique_ptr<command> make_run_command() {
  return std::make_unique<run_command>();
}

} // namespace dualpath::cmd
