#include "cmd/job_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>

#include <unistd.h>

#include <caf/atom.hpp>
#include <caf/sec.hpp>

#include "actors/protocol/register.hpp"
#include "cmd/progress.hpp"

namespace dualpath::cmd {

using actors::cluster::mode_report;

void job_flags::add(CLI::App& app, key_flags& flags) {
  flags.add(app, "--agents", "workload.agents");
  flags.add(app, "--turns", "run.turns");
  flags.add(app, "--prefill-nodes", "run.prefill_nodes");
  flags.add(app, "--decode-nodes", "run.decode_nodes");
  flags.add(app, "--mode", "run.modes");
  flags.add(app, "--aps", "run.aps");
  flags.add(app, "--time-scale", "run.time_scale");
  flags.add(app, "--byte-scale", "run.byte_scale");
  flags.add(app, "--trace", "observe.trace_file");
  app.add_option("--aps-sweep", sweep,
                 "Comma-separated agent arrival rates: runs each mode at "
                 "each rate and reports each mode's capacity under the SLO "
                 "(TTFT <= 4 s, TPOT <= 50 ms for 90% of requests). Not "
                 "with --aps.")
      ->type_name("A,B,...");
  app.add_option("--trace-file", trace_file,
                 "Replay this JSON-lines trace instead of generating one "
                 "(docs/workload.md).")
      ->type_name("FILE");
  app.add_option("--plot-dir", plot_dir,
                 "Write PNG plots (gnuplot) and their data here: JCT per "
                 "mode, agents finished over time, storage-NIC utilisation "
                 "PE vs DE side, TTFT CDF, TTFT p99 against APS for a "
                 "sweep.")
      ->type_name("DIR");
  app.add_flag("--quiet", quiet, "No progress line.");
}

caf::expected<job_plan> plan_job(const config::settings& cfg,
                                 const job_flags& flags,
                                 const std::string& command, job_clock clock) {
  auto bad = [](std::string msg) {
    return caf::make_error(caf::sec::invalid_argument, std::move(msg));
  };
  auto modes = actors::cluster::parse_variants(cfg.string("run.modes"));
  if (!modes)
    return modes.error();
  job_plan plan;
  auto& opts = plan.opts;
  opts.modes = *modes;
  opts.turns = static_cast<uint32_t>(cfg.integer("run.turns"));
  opts.aps = cfg.real("run.aps");
  opts.wall_limit = std::chrono::seconds(cfg.integer("run.wall_limit_s"));
  opts.simulate = clock == job_clock::simulated;
  if (!flags.trace_file.empty())
    opts.trace_file = flags.trace_file;
  auto rates = parse_rates(flags.sweep);
  if (!rates)
    return rates.error();
  plan.rates = std::move(*rates);
  if (!plan.rates.empty() && opts.aps > 0)
    return bad("--aps-sweep " + flags.sweep
               + " runs each mode at each of "
                 "its rates, but run.aps = "
               + config::to_string(cfg.get("run.aps")) + " ("
               + cfg.describe_source("run.aps")
               + ") asks for one rate: give one of them");
  if (auto err = check_output_file("--trace", cfg.string("observe.trace_file")))
    return err;
  if (!flags.plot_dir.empty()) {
    if (auto err = check_output_dir("--plot-dir", flags.plot_dir))
      return err;
    if (auto err = find_gnuplot(); !err)
      return err.error();
  }
  if (!flags.quiet) {
    // Shared by the copies of opts the sweep makes.
    auto meter = std::make_shared<progress_meter>(
        command == "sim" ? "sim " : "",
        progress_meter::output_for(STDERR_FILENO), stderr,
        clock == job_clock::simulated ? 256 : 16);
    opts.progress = [meter](const actors::cluster::job_progress& p) {
      meter->report(p);
    };
  }
  return plan;
}

const mode_report* find_mode(const std::vector<mode_report>& xs,
                             const std::string& name) {
  for (auto& x : xs)
    if (x.mode == name)
      return &x;
  return nullptr;
}

double ratio(const mode_report* num, const mode_report* den) {
  if (num == nullptr || den == nullptr || den->jct_s <= 0)
    return 0;
  return num->jct_s / den->jct_s;
}

nlohmann::json ratio_json(const mode_report* num, const mode_report* den) {
  if (num == nullptr || den == nullptr || den->jct_s <= 0)
    return nullptr;
  return num->jct_s / den->jct_s;
}

std::string embedded_shape(const config::settings& cfg) {
  return cfg.string("model.name") + " on an embedded emulated cluster of "
         + std::to_string(cfg.integer("run.prefill_nodes")) + "P"
         + std::to_string(cfg.integer("run.decode_nodes")) + "D x "
         + std::to_string(cfg.integer("hardware.gpus_per_node")) + " GPUs ("
         + cfg.string("hardware.profile") + " hardware)" + slice_note(cfg);
}

std::string slice_note(const config::settings& cfg) {
  auto slice = cfg.integer("hardware.slice");
  if (slice <= 1)
    return {};
  auto gpus = cfg.integer("hardware.gpus_per_node");
  auto n = std::to_string(slice);
  return "\n  scaled: a 1/" + n + " slice of a cluster of "
         + std::to_string(gpus * slice)
         + "-GPU nodes (hardware.slice): each GPU keeps its compute, HBM, "
           "compute NIC and share of the weights, each node's storage NIC, "
           "DRAM bandwidth and DRAM buffer are divided by "
         + n
         + ", so the storage-NIC-to-compute balance and the KV-to-compute "
           "ratio stay the unsliced cluster's and "
         + std::to_string(cfg.integer("workload.agents"))
         + " agents load it as "
         + std::to_string(cfg.integer("workload.agents") * slice)
         + " load that one (docs/tuning.md: the unscaled setting in sim)";
}

namespace {

std::string fixed(double x, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << x;
  return out.str();
}

std::string number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

std::string percent(double share) {
  return fixed(share * 100, 0) + "%";
}

std::string mode_list(const std::vector<mode_report>& modes) {
  std::string out;
  for (size_t i = 0; i < modes.size(); ++i)
    out += (i == 0                  ? ""
            : i + 1 == modes.size() ? " and "
                                    : ", ")
           + modes[i].mode;
  return out;
}

} // namespace

std::string verdict(const std::vector<mode_report>& modes) {
  auto basic = find_mode(modes, "basic");
  auto dual = find_mode(modes, "dualpath");
  auto oracle = find_mode(modes, "oracle");
  std::string out;
  if (basic && dual && dual->jct_s > 0) {
    auto r = basic->jct_s / dual->jct_s;
    out +=
        r >= 1.005
            ? "DualPath finished the job " + fixed(r, 2) + "x faster than Basic"
        : r <= 0.995 ? "DualPath took " + fixed(1 / r, 2) + "x as long as Basic"
                     : "DualPath and Basic finished in the same time";
    out += " (JCT " + fixed(dual->jct_s, 2) + " s against "
           + fixed(basic->jct_s, 2) + " s)";
    if (r < 1.1)
      out += ": the job is not bound by the prefill side's storage NICs "
             "here, so a second read path buys little (docs/tuning.md)";
  }
  if (dual && oracle && oracle->jct_s > 0) {
    auto r = dual->jct_s / oracle->jct_s;
    out += out.empty() ? "DualPath" : "; it";
    out += r >= 1.005 ? " came within " + fixed((r - 1) * 100, 0)
                            + "% of Oracle's zero-I/O JCT ("
                            + fixed(oracle->jct_s, 2) + " s)"
           : r <= 0.995
               ? " beat Oracle's zero-I/O JCT (" + fixed(oracle->jct_s, 2)
                     + " s) by " + fixed((1 - r) * 100, 0)
                     + "%, which is noise: Oracle is a bound"
               : " matched Oracle's zero-I/O JCT (" + fixed(oracle->jct_s, 2)
                     + " s)";
  }
  if (out.empty())
    return out;
  out += ". Storage NICs busy (mean over the JCT), prefill side / decode "
         "side:";
  for (size_t i = 0; i < modes.size(); ++i)
    out += std::string{i == 0 ? " " : "; "} + modes[i].mode + " "
           + percent(modes[i].snic_util_pe) + " / "
           + percent(modes[i].snic_util_de);
  return out + ".";
}

void print_report_head(std::ostream& out, const std::string& command,
                       const actors::cluster::job_result& res,
                       const actors::cluster::job_options& opts,
                       const std::string& where, const std::string& plane,
                       actors::cluster::reroute_row reroutes) {
  out << "dualpath " << command << ": compares " << mode_list(res.modes)
      << " on the same trace and cluster\n"
      << "  trace: " << res.agents << " agents, " << res.requests_per_mode
      << " requests per mode, mean prompt " << fixed(res.mean_prompt_tokens, 0)
      << " tokens (" << fixed(res.mean_hit_share * 100, 1)
      << "% in storage at the first replayed turn); "
      << (opts.aps > 0 ? "online: agents arrive at " + number(opts.aps)
                             + " agents per emulated second (Poisson)"
                       : std::string{"offline: every agent starts at t = 0"})
      << "\n"
      << "  cluster: " << where << "\n"
      << "  " << plane << "\n\n";
  actors::cluster::print_table(out, res.modes, reroutes);
  out << '\n';
  actors::cluster::print_bounds(out, res.bounds, res.modes);
  if (auto v = verdict(res.modes); !v.empty())
    out << "\nverdict: " << v << "\n";
  auto basic = find_mode(res.modes, "basic");
  auto dual = find_mode(res.modes, "dualpath");
  auto oracle = find_mode(res.modes, "oracle");
  if (basic && dual)
    out << "Basic / DualPath JCT: " << fixed(ratio(basic, dual), 2) << "x\n";
  if (dual && oracle)
    out << "DualPath / Oracle JCT: " << fixed(ratio(dual, oracle), 2) << "x\n";
}

void print_report_tail(std::ostream& out,
                       const actors::cluster::job_result& res,
                       const sweep_results& sweep) {
  out << "wall time: " << fixed(res.wall_s, 1) << " s (store pre-population "
      << fixed(res.populate_s, 1) << " s)\n";
  if (sweep.empty())
    return;
  for (auto& [aps, r] : sweep) {
    out << "\nonline replay at " << number(aps)
        << " agents per emulated second (Poisson arrivals):\n";
    actors::cluster::print_table(out, r.modes);
  }
  auto cap = capacity(sweep);
  auto lower = capacity_is_lower_bound(sweep);
  auto lowest = sweep.front().first;
  for (auto& [aps, r] : sweep)
    lowest = std::min(lowest, aps);
  out << "\ncapacity under the SLO (>= 90% of requests with TTFT <= 4 s and "
         "TPOT <= 50 ms):\n";
  for (auto& m : sweep.front().second.modes) {
    auto c = cap.value(m.mode, 0.0);
    out << "  " << m.mode << ": ";
    if (c <= 0)
      out << "< " << number(lowest)
          << " APS (the SLO failed at every rate swept)\n";
    else if (lower.value(m.mode, false))
      out << ">= " << number(c)
          << " APS (a lower bound: the SLO still held at the highest rate "
             "swept; sweep higher to find the capacity)\n";
    else
      out << number(c) << " APS\n";
  }
}

caf::expected<std::vector<double>> parse_rates(const std::string& text) {
  std::vector<double> rates;
  std::stringstream in{text};
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty())
      continue;
    char* end = nullptr;
    auto x = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !(x > 0))
      return caf::make_error(caf::sec::invalid_argument,
                             "--aps-sweep: '" + item
                                 + "' is not a positive number of agents "
                                   "per second");
    rates.push_back(x);
  }
  return rates;
}

std::string error_text(const caf::error& err) {
  auto cat = err.category();
  if (cat == caf::atom("dp_config") || cat == caf::atom("dp_wkload")
      || cat == caf::atom("system")) {
    auto& ctx = err.context();
    if (!ctx.empty() && ctx.match_element<std::string>(0))
      return ctx.get_as<std::string>(0);
  }
  return actors::render(err);
}

bool is_bad_input(const caf::error& err) {
  return (err.category() == caf::atom("system")
          && err.code() == static_cast<uint8_t>(caf::sec::invalid_argument))
         || err.category() == caf::atom("dp_wkload")
         || err.category() == caf::atom("dp_config");
}

nlohmann::json capacity(const sweep_results& sweep) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& [aps, r] : sweep)
    for (auto& m : r.modes) {
      if (!out.contains(m.mode))
        out[m.mode] = 0.0;
      if (m.slo_attainment >= 0.9 && aps > out[m.mode].get<double>())
        out[m.mode] = aps;
    }
  return out;
}

nlohmann::json capacity_is_lower_bound(const sweep_results& sweep) {
  nlohmann::json out = nlohmann::json::object();
  if (sweep.empty())
    return out;
  auto top = sweep.front().first;
  for (auto& [aps, r] : sweep)
    top = std::max(top, aps);
  auto cap = capacity(sweep);
  for (auto& [mode, c] : cap.items())
    out[mode] = c.get<double>() >= top;
  return out;
}

nlohmann::json job_json(const actors::cluster::job_result& res,
                        const sweep_results& sweep) {
  nlohmann::json doc;
  auto& jm = doc["modes"] = nlohmann::json::object();
  for (auto& m : res.modes)
    jm[m.mode] = actors::cluster::to_json(m);
  auto basic = find_mode(res.modes, "basic");
  auto dual = find_mode(res.modes, "dualpath");
  auto oracle = find_mode(res.modes, "oracle");
  doc["ratios"] = {{"basic_over_dualpath_jct", ratio_json(basic, dual)},
                   {"dualpath_over_oracle_jct", ratio_json(dual, oracle)}};
  doc["wall_s"] = res.wall_s;
  doc["populate_s"] = res.populate_s;
  doc["byte_scale"] = res.byte_scale;
  doc["time_scale"] = res.time_scale;
  doc["agents"] = res.agents;
  doc["requests_per_mode"] = res.requests_per_mode;
  doc["mean_prompt_tokens"] = res.mean_prompt_tokens;
  doc["mean_hit_share"] = res.mean_hit_share;
  doc["bounds"] = actors::cluster::to_json(res.bounds);
  if (!sweep.empty()) {
    auto& js = doc["aps_sweep"] = nlohmann::json::array();
    for (auto& [aps, r] : sweep) {
      nlohmann::json point{{"aps", aps}};
      for (auto& m : r.modes)
        point["modes"][m.mode] = actors::cluster::to_json(m);
      js.push_back(std::move(point));
    }
    doc["capacity_aps"] = capacity(sweep);
    doc["capacity_is_lower_bound"] = capacity_is_lower_bound(sweep);
  }
  return doc;
}

} // namespace dualpath::cmd
