#include "cmd/plots.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/sec.hpp>

extern char** environ;

namespace dualpath::cmd {

namespace {

using actors::engine_role;
using actors::cluster::job_result;
using actors::cluster::mode_timeline;

// A failed C call, keeping its name and errno.
caf::error call_error(const char* call, const std::string& what, int err) {
  return caf::make_error(caf::sec::runtime_error, std::string{"--plot-dir: "}
                                                      + call + " " + what + ": "
                                                      + std::strerror(err));
}

caf::error plot_error(const std::string& msg) {
  return caf::make_error(caf::sec::runtime_error, "--plot-dir: " + msg);
}

// One colour per mode, the same in every plot.
const char* colour(size_t i) {
  static const char* colours[] = {"#d62728", "#1f77b4", "#2ca02c",
                                  "#ff7f0e", "#9467bd", "#8c564b"};
  return colours[i % (sizeof(colours) / sizeof(colours[0]))];
}

// Mean storage-NIC utilisation of one side over each sampled interval, as
// steps: (start, u), (end, u). A timeline with fewer than two samples (or a
// simulation's first and last only) still gives one interval, so a plot is
// never empty.
std::vector<std::pair<double, double>> side_steps(const mode_timeline& tl,
                                                  engine_role side,
                                                  double fallback_util,
                                                  double jct_s) {
  std::vector<std::pair<double, double>> out;
  for (size_t i = 1; i < tl.samples.size(); ++i) {
    auto& a = tl.samples[i - 1];
    auto& b = tl.samples[i];
    auto dt = b.t_s - a.t_s;
    if (dt <= 0)
      continue;
    double moved = 0;
    double rate = 0;
    for (size_t n = 0; n < tl.nodes.size() && n < tl.roles.size(); ++n) {
      if (tl.roles[n] != side || n >= a.bytes.size() || n >= b.bytes.size())
        continue;
      moved += static_cast<double>(b.bytes[n] - a.bytes[n]);
      rate += static_cast<double>(tl.rates[n]);
    }
    auto u = rate > 0 ? moved / (rate * dt) : 0.0;
    out.emplace_back(a.t_s, u);
    out.emplace_back(b.t_s, u);
  }
  if (out.empty()) {
    out.emplace_back(0.0, fallback_util);
    out.emplace_back(jct_s > 0 ? jct_s : 1.0, fallback_util);
  }
  return out;
}

// Writes the step curve of ascending `xs` into `out` (file `name`): y rises
// by `step` at each x, from (0, 0). Returns its gnuplot plot element, in
// mode `i`'s colour, titled `title`.
std::string cumulative(std::ostream& out, const std::string& name,
                       const std::vector<double>& xs, double step, size_t i,
                       const std::string& title) {
  out << "0 0\n";
  for (size_t k = 0; k < xs.size(); ++k)
    out << xs[k] << ' ' << static_cast<double>(k + 1) * step << '\n';
  return "'" + name + "' using 1:2 with steps lw 2 lc rgb '" + colour(i)
         + "' title '" + title + "'";
}

// Runs `gnuplot plots.gnuplot` in `dir` without a shell; its output goes to
// dir/gnuplot.log.
caf::error run_gnuplot(const std::string& dir) {
  auto exe = find_gnuplot();
  if (!exe)
    return exe.error();
  posix_spawn_file_actions_t actions;
  if (auto rc = posix_spawn_file_actions_init(&actions); rc != 0)
    return call_error("posix_spawn_file_actions_init", dir, rc);
  struct actions_guard {
    posix_spawn_file_actions_t* a;
    ~actions_guard() {
      posix_spawn_file_actions_destroy(a);
    }
  } guard{&actions};
  int rc = posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  if (rc == 0)
    rc = posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                          O_RDONLY, 0);
  if (rc == 0)
    rc =
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "gnuplot.log",
                                         O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (rc == 0)
    rc = posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO,
                                          STDERR_FILENO);
  if (rc != 0)
    return call_error("posix_spawn_file_actions", dir, rc);
  std::string arg0 = "gnuplot";
  std::string arg1 = "plots.gnuplot";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  rc = posix_spawn(&pid, exe->c_str(), &actions, nullptr, argv, environ);
  if (rc != 0)
    return call_error("posix_spawn", *exe, rc);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return call_error("waitpid", *exe, errno);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return {};
  std::ifstream log{dir + "/gnuplot.log"};
  std::stringstream text;
  text << log.rdbuf();
  auto tail = text.str();
  if (tail.size() > 600)
    tail = "..." + tail.substr(tail.size() - 600);
  return plot_error("gnuplot failed on " + dir + "/plots.gnuplot ("
                    + (WIFEXITED(status)
                           ? "exit " + std::to_string(WEXITSTATUS(status))
                           : "signal " + std::to_string(WTERMSIG(status)))
                    + "): " + tail);
}

} // namespace

caf::expected<std::string> find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs{path != nullptr ? path : "/usr/bin:/bin"};
  std::string d;
  while (std::getline(dirs, d, ':')) {
    auto exe = (d.empty() ? std::string{"."} : d) + "/gnuplot";
    struct stat st {};
    if (::stat(exe.c_str(), &st) == 0 && S_ISREG(st.st_mode)
        && ::access(exe.c_str(), X_OK) == 0)
      return exe;
  }
  return caf::make_error(caf::sec::invalid_argument,
                         "--plot-dir needs gnuplot, which is not on PATH "
                         "(Debian: apt-get install gnuplot-nox)");
}

std::vector<std::string> plot_files(const job_result& res,
                                    const sweep_results& sweep) {
  std::vector<std::string> out{"jct.png", "agents_done.png"};
  for (auto& tl : res.timelines)
    out.push_back("snic_" + tl.mode + ".png");
  out.emplace_back("ttft_cdf.png");
  if (!sweep.empty())
    out.emplace_back("ttft_aps.png");
  return out;
}

caf::error write_plots(const std::string& dir, const job_result& res,
                       const sweep_results& sweep) {
  std::vector<std::string> written;
  auto open = [&](const std::string& name) {
    written.push_back(name);
    return std::ofstream{dir + "/" + name, std::ios::trunc};
  };
  std::ostringstream gp;
  gp << "# The plots of one dualpath job; render with `gnuplot "
        "plots.gnuplot` in this directory.\n"
     << "set terminal pngcairo size 1000,560 enhanced font ',11'\n"
     << "set grid ytics lc rgb '#dddddd'\nset key top left\n";
  // JCT per mode: one coloured bar each, its value on top.
  {
    auto out = open("jct.dat");
    double top = 0;
    for (size_t i = 0; i < res.modes.size(); ++i) {
      out << i << ' ' << res.modes[i].mode << ' ' << res.modes[i].jct_s << ' '
          << i + 1 << '\n';
      top = std::max(top, res.modes[i].jct_s);
    }
    gp << "set output 'jct.png'\nset title 'Job completion time per mode'\n"
       << "set xlabel ''\nset ylabel 'JCT (emulated s)'\n"
       << "set style fill solid 0.8 border -1\nset boxwidth 0.6\n"
       << "set yrange [0:" << (top > 0 ? top * 1.2 : 1) << "]\n"
       << "set xrange [-0.6:" << static_cast<double>(res.modes.size()) - 0.4
       << "]\n";
    for (size_t i = 0; i < res.modes.size(); ++i)
      gp << "set linetype " << i + 1 << " lc rgb '" << colour(i) << "'\n";
    gp << "plot 'jct.dat' using 1:3:4:xtic(2) with boxes lc variable "
          "notitle, '' using 1:3:(sprintf('%.2f s', $3)) with labels "
          "offset 0,1 notitle\n"
       << "unset style\nset style fill empty\nunset xrange\n"
       << "set xtics auto\n";
  }
  // Agents finished over time, one step line per mode.
  {
    gp << "set output 'agents_done.png'\n"
       << "set title 'Agents finished over time'\n"
       << "set xlabel 'emulated time (s)'\nset ylabel 'agents finished'\n"
       << "set yrange [0:*]\nset xrange [0:*]\nplot ";
    for (size_t i = 0; i < res.timelines.size(); ++i) {
      auto& tl = res.timelines[i];
      auto out = open("agents_" + tl.mode + ".dat");
      gp << (i ? ", " : "")
         << cumulative(out, written.back(), tl.agent_done_s, 1.0, i, tl.mode);
    }
    gp << "\n";
  }
  // Storage-NIC utilisation per mode, prefill side against decode side.
  for (size_t i = 0; i < res.timelines.size(); ++i) {
    auto& tl = res.timelines[i];
    const actors::cluster::mode_report* rep = nullptr;
    for (auto& m : res.modes)
      if (m.mode == tl.mode)
        rep = &m;
    auto jct = rep ? rep->jct_s : 0.0;
    auto pe =
        side_steps(tl, engine_role::prefill, rep ? rep->snic_util_pe : 0, jct);
    auto de =
        side_steps(tl, engine_role::decode, rep ? rep->snic_util_de : 0, jct);
    auto name = "snic_" + tl.mode + ".dat";
    {
      auto out = open(name);
      out << "# prefill side\n";
      for (auto& [t, u] : pe)
        out << t << ' ' << u << '\n';
      out << "\n\n# decode side\n";
      for (auto& [t, u] : de)
        out << t << ' ' << u << '\n';
    }
    auto idle =
        std::all_of(pe.begin(), pe.end(), [](auto& x) { return x.second == 0; })
        && std::all_of(de.begin(), de.end(),
                       [](auto& x) { return x.second == 0; });
    gp << "set output 'snic_" << tl.mode << ".png'\n"
       << "set title 'Storage-NIC utilisation over time: " << tl.mode
       << " (mean over each side)'\n"
       << "set xlabel 'emulated time (s)'\nset ylabel 'utilisation'\n"
       << "set yrange [-0.03:1.1]\nset xrange [0:*]\n";
    if (idle)
      gp << "set label 1 'no storage-NIC reads in this mode' at graph "
            "0.5,0.5 center\n";
    gp << "plot '" << name << "' index 0 using 1:2 with lines lw 3 lc rgb "
       << "'#1f77b4' title 'prefill side', '' index 1 using 1:2 with lines "
          "lw 3 dt 2 lc rgb '#ff7f0e' title 'decode side'\n"
       << "unset label 1\n";
  }
  // TTFT CDF per mode.
  {
    gp << "set output 'ttft_cdf.png'\nset title 'Time to first token, CDF'\n"
       << "set xlabel 'TTFT (emulated s)'\nset ylabel 'share of requests'\n"
       << "set yrange [0:1.02]\nset xrange [0:*]\nset key bottom right\n"
       << "plot ";
    for (size_t i = 0; i < res.timelines.size(); ++i) {
      auto& tl = res.timelines[i];
      auto out = open("ttft_" + tl.mode + ".dat");
      auto share = tl.ttft_s.empty() ? 1.0 : 1.0 / tl.ttft_s.size();
      gp << (i ? ", " : "")
         << cumulative(out, written.back(), tl.ttft_s, share, i, tl.mode);
    }
    gp << "\nset key top left\n";
  }
  // TTFT p99 against the arrival rate, with the SLO.
  if (!sweep.empty()) {
    auto& modes = sweep.front().second.modes;
    {
      auto out = open("ttft_aps.dat");
      for (auto& [aps, r] : sweep) {
        out << aps;
        for (auto& m : r.modes)
          out << ' ' << m.ttft_p99_s;
        out << '\n';
      }
    }
    gp << "set output 'ttft_aps.png'\n"
       << "set title 'TTFT p99 against the agent arrival rate'\n"
       << "set xlabel 'agents per emulated second'\n"
       << "set ylabel 'TTFT p99 (emulated s)'\nset yrange [0:*]\n"
       << "set xrange [*:*]\nplot ";
    for (size_t i = 0; i < modes.size(); ++i)
      gp << (i ? ", " : "") << "'ttft_aps.dat' using 1:" << i + 2
         << " with linespoints lw 2 pt 7 lc rgb '" << colour(i) << "' title '"
         << modes[i].mode << "'";
    gp << ", 4 with lines dt 2 lw 2 lc rgb '#555555' title 'SLO: TTFT 4 s'\n";
  }
  {
    auto script = open("plots.gnuplot");
    script << gp.str();
  }
  for (auto& name : written) {
    std::ifstream check{dir + "/" + name};
    if (!check)
      return call_error("open", dir + "/" + name, errno);
  }
  return run_gnuplot(dir);
}

} // namespace dualpath::cmd
