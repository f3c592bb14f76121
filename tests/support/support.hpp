// Helpers shared by the test suites: temporary directories, skipping a suite
// whose hardware is absent, running the dualpath binary as a real process,
// running CAF's test coordinator until a condition holds.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <caf/scheduler/test_coordinator.hpp>

namespace dualpath::test {

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it
/// when the object dies.
class temp_dir {
public:
  explicit temp_dir(const std::string& prefix = "dualpath-test");
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::string& path() const {
    return path_;
  }

  /// path() + "/" + name.
  std::string file(const std::string& name) const;

private:
  std::string path_;
};

/// Prints "SKIP <suite>: <reason>" and exits with status 77, which ctest
/// reports as skipped. For suites whose hardware (RDMA NIC, GPU) is absent.
[[noreturn]] void skip_suite(const std::string& suite,
                             const std::string& reason);

/// Result of running a process.
struct process_result {
  int status = -1; ///< Exit status, or 128+signal.
  std::string out; ///< Captured stdout.
  std::string err; ///< Captured stderr.
};

/// Runs `argv` (argv[0] is a path) with no stdin, capturing stdout and stderr.
process_result run_process(const std::vector<std::string>& argv);

/// Runs `argv` with its stderr on a pseudo-terminal (stdout to /dev/null):
/// `err` is what the terminal showed (the terminal turns "\n" into "\r\n").
process_result run_on_terminal(const std::vector<std::string>& argv);

/// The path of the built `dualpath` binary.
std::string dualpath_binary();

/// Writes `content` to `path` (truncating).
void write_file(const std::string& path, const std::string& content);

/// Runs the coordinator's jobs, then fires its next timer, until `done()`
/// holds or no timer is left (at most `max_timers` timers); then the jobs
/// due.
void run_until(caf::scheduler::test_coordinator& sched,
               const std::function<bool()>& done, int max_timers = 100000);

} // namespace dualpath::test
