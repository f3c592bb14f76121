#include "cmd/job_report.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <caf/atom.hpp>
#include <caf/sec.hpp>

#include "actors/protocol/register.hpp"

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
  app.add_option("--aps-sweep", sweep,
                 "Comma-separated agent arrival rates: runs each mode at "
                 "each rate and reports each mode's capacity under the SLO "
                 "(TTFT <= 4 s, TPOT <= 50 ms for 90% of requests).")
      ->type_name("A,B,...");
  app.add_option("--trace-file", trace_file,
                 "Replay this JSON-lines trace instead of generating one "
                 "(docs/workload.md).")
      ->type_name("FILE");
  app.add_flag("--quiet", quiet, "No progress line.");
}

void job_flags::apply(actors::cluster::job_options& opts,
                      const std::string& prefix, uint64_t every) const {
  if (!trace_file.empty())
    opts.trace_file = trace_file;
  if (quiet)
    return;
  opts.progress = [prefix, every](const std::string& mode, uint64_t done,
                                  uint64_t total) {
    if (done % every == 0 || done == total) {
      std::fprintf(stderr, "\r[%s%s] requests %llu/%llu   ", prefix.c_str(),
                   mode.c_str(), static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(total));
      if (done == total)
        std::fprintf(stderr, "\n");
    }
  };
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

nlohmann::json job_json(const actors::cluster::job_result& res,
                        const sweep_results& sweep) {
  nlohmann::json doc;
  auto& jm = doc["modes"] = nlohmann::json::object();
  for (auto& m : res.modes)
    jm[m.mode] = actors::cluster::to_json(m);
  auto basic = find_mode(res.modes, "basic");
  auto dual = find_mode(res.modes, "dualpath");
  auto oracle = find_mode(res.modes, "oracle");
  doc["ratios"] = {{"basic_over_dualpath_jct", ratio(basic, dual)},
                   {"dualpath_over_oracle_jct", ratio(dual, oracle)}};
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
  }
  return doc;
}

} // namespace dualpath::cmd
