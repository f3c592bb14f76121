// What `dualpath run` and `dualpath sim` share around a job: their common
// options, parsing --aps-sweep, classifying and rendering a job's error, and
// the JSON report (modes, ratios, job facts, the sweep and each mode's capacity
// under the SLO). Pure functions; no state.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/cluster/job.hpp"
#include "cmd/command.hpp"

namespace dualpath::cmd {

using sweep_results =
    std::vector<std::pair<double, actors::cluster::job_result>>;

/// The options `run` and `sim` both take: the workload and cluster shape
/// keys, --aps-sweep, --trace-file and --quiet.
struct job_flags {
  std::string sweep;
  std::string trace_file;
  bool quiet = false;

  void add(CLI::App& app, key_flags& flags);

  /// Sets opts.trace_file and, unless --quiet, a progress line on stderr
  /// ("[<prefix><mode>] requests done/total", every `every` requests).
  void apply(actors::cluster::job_options& opts, const std::string& prefix,
             uint64_t every) const;
};

/// The mode named `name` in `xs`, or null.
const actors::cluster::mode_report*
find_mode(const std::vector<actors::cluster::mode_report>& xs,
          const std::string& name);

/// JCT of `num` over JCT of `den` (0 when either is missing or den is 0).
double ratio(const actors::cluster::mode_report* num,
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
/// SLO.
nlohmann::json capacity(const sweep_results& sweep);

/// The JSON report of `res` (and of the sweep, when not empty) that both
/// commands write; callers add their own keys.
nlohmann::json job_json(const actors::cluster::job_result& res,
                        const sweep_results& sweep);

} // namespace dualpath::cmd
