// What `dualpath run` and `dualpath sim` share around a job: their common
// options, parsing --aps-sweep, classifying and rendering a job's error, and
// the JSON report (modes, ratios, job facts, the sweep and each mode's capacity
// under the SLO). Pure functions; no state.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/cluster/job.hpp"
#include "cmd/command.hpp"
#include "cmd/plots.hpp"

namespace dualpath::cmd {

/// The options `run` and `sim` both take: the workload and cluster shape
/// keys, --aps-sweep, --trace-file, --plot-dir and --quiet.
struct job_flags {
  std::string sweep;
  std::string trace_file;
  std::string plot_dir;
  bool quiet = false;

  void add(CLI::App& app, key_flags& flags);
};

/// How a job's time runs.
enum class job_clock : uint8_t {
  /// Real time, real bytes (`run`).
  real,
  /// Simulated time, modeled data plane (`sim`).
  simulated,
};

/// What `run` or `sim` is about to do: the job's options and the rates of
/// the sweep that follows it (empty: none).
struct job_plan {
  actors::cluster::job_options opts;
  std::vector<double> rates;
};

/// The plan from the configuration and the flags. Checks, before any work,
/// what would otherwise fail only after the whole job: the output paths
/// (--plot-dir, observe.trace_file; --json is checked for every command),
/// that gnuplot can be found for --plot-dir, and options that contradict
/// each other (--aps with --aps-sweep). Every failure is bad input (exit 2).
/// Unless --quiet, opts.progress reports on stderr (cmd/progress.hpp).
caf::expected<job_plan> plan_job(const config::settings& cfg,
                                 const job_flags& flags,
                                 const std::string& command, job_clock clock);

/// Where the compared modes ran, for the report's first lines:
/// "ds-660b on an embedded emulated cluster of 2P4D x 8 GPUs (...)", and on
/// a second line what a slice (hardware.slice > 1) scales.
std::string embedded_shape(const config::settings& cfg);

/// "\n  scaled: ..." for a sliced cluster (hardware.slice > 1), else "".
std::string slice_note(const config::settings& cfg);

/// The first part of the text report of `run` and `sim`: what is compared
/// on what (`where`: the cluster; `plane`: what the data plane does), the
/// table (with a reroutes row when `reroutes` is show), the bounds and the
/// verdict in words.
void print_report_head(std::ostream& out, const std::string& command,
                       const actors::cluster::job_result& res,
                       const actors::cluster::job_options& opts,
                       const std::string& where, const std::string& plane,
                       actors::cluster::reroute_row reroutes);

/// The verdict: how much faster DualPath finished than Basic, how close it
/// came to Oracle, and how busy each side's storage NICs were in each mode
/// (nothing when neither comparison's modes ran).
std::string verdict(const std::vector<actors::cluster::mode_report>& modes);

/// The last part: wall time, then the sweep's tables, each labelled with its
/// rate, and each mode's capacity under the SLO (a lower bound when the SLO
/// still held at the highest rate swept).
void print_report_tail(std::ostream& out,
                       const actors::cluster::job_result& res,
                       const sweep_results& sweep);

/// The mode named `name` in `xs`, or null.
const actors::cluster::mode_report*
find_mode(const std::vector<actors::cluster::mode_report>& xs,
          const std::string& name);

/// JCT of `num` over JCT of `den` (0 when either is missing or den is 0).
double ratio(const actors::cluster::mode_report* num,
             const actors::cluster::mode_report* den);

/// The same ratio as JSON: null when either mode is missing.
nlohmann::json ratio_json(const actors::cluster::mode_report* num,
                          const actors::cluster::mode_report* den);

/// The rates of --aps-sweep "a,b,c" (empty text: none). Fails with the
/// message to print, naming the item that is not a positive number.
caf::expected<std::vector<double>> parse_rates(const std::string& text);

/// The message of a job's error (configuration and workload errors carry it
/// as their first context element).
std::string error_text(const caf::error& err);

/// Whether a job's error is bad input (exit 2: configuration, workload or
/// an invalid argument) rather than a failed run (exit 1).
bool is_bad_input(const caf::error& err);

/// The highest swept rate at which >= 90% of each mode's requests meet the
/// SLO (0 when none).
nlohmann::json capacity(const sweep_results& sweep);

/// Per mode, whether its capacity is only a lower bound: the SLO still held
/// at the highest rate swept.
nlohmann::json capacity_is_lower_bound(const sweep_results& sweep);

/// The JSON report of `res` (and of the sweep, when not empty) that both
/// commands write; callers add their own keys.
nlohmann::json job_json(const actors::cluster::job_result& res,
                        const sweep_results& sweep);

} // namespace dualpath::cmd
