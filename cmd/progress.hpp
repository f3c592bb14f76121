// The progress line of `dualpath run` and `dualpath sim` on stderr. On a
// terminal: one line updated in place (at most ten times a second) with the
// mode, what is done of what, the emulated time and an ETA. Elsewhere (a
// file, a pipe): a plain line every `every` requests (every twentieth of
// them when that is more) and at each mode's end, never a carriage return.
// Store population reports the same way.
//
// Thread safety: report() may be called from any thread (a mutex orders the
// lines). Owns nothing but its state; writes to the FILE it is given.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "actors/cluster/job.hpp"

namespace dualpath::cmd {

/// Where the progress line goes.
enum class progress_output : uint8_t {
  /// A terminal: one line, rewritten in place.
  terminal,
  /// A file or pipe: plain lines.
  lines,
};

class progress_meter {
public:
  /// `prefix` precedes the mode in brackets ("sim " -> "[sim basic]");
  /// `every`: requests between two plain lines.
  progress_meter(std::string prefix, progress_output output, std::FILE* to,
                 uint64_t every);

  /// The output for `fd`: terminal when it is one.
  static progress_output output_for(int fd);

  void report(const actors::cluster::job_progress& p);

private:
  using clock = std::chrono::steady_clock;

  std::string line(const actors::cluster::job_progress& p,
                   clock::time_point now) const;

  std::string prefix_;
  progress_output output_;
  std::FILE* to_;
  uint64_t every_;
  std::mutex mtx_;
  // The phase and mode the line is about, and when it started.
  actors::cluster::job_progress::phase step_ =
      actors::cluster::job_progress::phase::replay;
  std::string mode_;
  clock::time_point started_{};
  clock::time_point last_draw_{};
  uint64_t last_step_ = 0; // lines: the last `every` multiple printed
};

} // namespace dualpath::cmd
