// The PNG plots of `dualpath run` and `dualpath sim` (--plot-dir DIR): the
// data files and one gnuplot script are written into DIR and gnuplot runs
// there, started without a shell (posix_spawnp with DIR as its working
// directory), so the script names only files relative to DIR and any
// directory name works, quotes included. `cd DIR && gnuplot plots.gnuplot`
// renders them again.
//
// The plots: jct.png (JCT per mode, the value on each bar),
// agents_done.png (agents finished over emulated time, one line per mode),
// snic_<mode>.png (storage-NIC utilisation over time, prefill side against
// decode side; a mode that reads nothing says so on the plot), ttft_cdf.png
// (TTFT CDF per mode) and, for a sweep, ttft_aps.png (TTFT p99 against the
// arrival rate, with the SLO's TTFT as a line).
//
// Thread safety: functions of the main thread (they run a child process).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/cluster/job.hpp"

namespace dualpath::cmd {

/// Each swept rate (agents per second) with the job it ran.
using sweep_results =
    std::vector<std::pair<double, actors::cluster::job_result>>;

/// The path of the gnuplot executable on PATH; caf::sec::invalid_argument
/// saying how to get it when there is none.
caf::expected<std::string> find_gnuplot();

/// Writes the plots of `res` (and of `sweep`, when not empty) into `dir`,
/// which exists. caf::sec::runtime_error naming the step when a file cannot
/// be written or gnuplot fails (with the end of its log, DIR/gnuplot.log).
caf::error write_plots(const std::string& dir,
                       const actors::cluster::job_result& res,
                       const sweep_results& sweep);

/// The file names write_plots renders for `res` and `sweep`, in order.
std::vector<std::string> plot_files(const actors::cluster::job_result& res,
                                    const sweep_results& sweep);

} // namespace dualpath::cmd
