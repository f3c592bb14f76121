// Helpers shared by the test suites: temporary directories, skipping a suite
// whose hardware is absent, running the dualpath binary as a real process (in
// the foreground or the background), loopback sockets, running CAF's test
// coordinator until a condition holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

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

/// A process running in the background, stdin from /dev/null, stdout and
/// stderr in files; killed (SIGKILL) if still running when the object dies.
class background_process {
public:
  /// Starts `argv` (argv[0] is a path).
  background_process(const std::vector<std::string>& argv,
                     const std::string& out_file, const std::string& err_file);
  ~background_process();

  background_process(const background_process&) = delete;
  background_process& operator=(const background_process&) = delete;

  bool running();

  pid_t pid() const {
    return pid_;
  }

  void signal(int sig);

  /// Waits for the exit; returns the status (128 + signal if killed).
  int wait();

  /// Waits up to `limit` for the exit; SIGKILL afterwards.
  int wait_for(std::chrono::seconds limit);

  std::string out() const;
  std::string err() const;

  /// Waits until stderr contains `text` (true) or the process ends or
  /// `limit` passes (false).
  bool wait_err(const std::string& text, std::chrono::seconds limit);

private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string out_;
  std::string err_;
};

/// A TCP port on 127.0.0.1 that was free a moment ago.
uint16_t free_port();

/// A TCP connection to 127.0.0.1:`port`, or -1 when it cannot be made.
int connect_loopback(uint16_t port);

/// Everything `fd` receives until the peer closes (or 5 s pass in silence).
std::string read_to_end(int fd);

/// Runs the coordinator's jobs, then fires its next timer, until `done()`
/// holds or no timer is left (at most `max_timers` timers); then the jobs
/// due.
void run_until(caf::scheduler::test_coordinator& sched,
               const std::function<bool()>& done, int max_timers = 100000);

} // namespace dualpath::test
