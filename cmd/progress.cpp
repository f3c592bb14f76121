#include "cmd/progress.hpp"

#include <algorithm>
#include <sstream>

#include <unistd.h>

namespace dualpath::cmd {

using actors::cluster::job_progress;

progress_meter::progress_meter(std::string prefix, progress_output output,
                               std::FILE* to, uint64_t every)
    : prefix_(std::move(prefix)),
      output_(output),
      to_(to),
      every_(every == 0 ? 1 : every) {
}

progress_output progress_meter::output_for(int fd) {
  return ::isatty(fd) == 1 ? progress_output::terminal : progress_output::lines;
}

std::string progress_meter::line(const job_progress& p,
                                 clock::time_point now) const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << '[' << prefix_ << p.mode << "] ";
  if (p.step == job_progress::phase::populate)
    out << "populating the store: agents " << p.done << '/' << p.total;
  else
    out << "requests " << p.done << '/' << p.total << ", emulated "
        << p.emulated_s << " s";
  auto elapsed = std::chrono::duration<double>(now - started_).count();
  if (p.done >= p.total)
    out << ", done in " << elapsed << " s";
  else if (p.done > 0 && elapsed > 0.5)
    out << ", ETA "
        << elapsed * static_cast<double>(p.total - p.done)
               / static_cast<double>(p.done)
        << " s";
  return out.str();
}

void progress_meter::report(const job_progress& p) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto now = clock::now();
  if (p.step != step_ || p.mode != mode_) {
    step_ = p.step;
    mode_ = p.mode;
    started_ = now;
    last_draw_ = {};
    last_step_ = 0;
  }
  auto finished = p.done >= p.total;
  if (output_ == progress_output::terminal) {
    if (!finished && now - last_draw_ < std::chrono::milliseconds{100})
      return;
    last_draw_ = now;
    // \r to the line's start, ESC[K clears what a longer line left.
    std::fprintf(to_, "\r\033[K%s", line(p, now).c_str());
    if (finished)
      std::fputc('\n', to_);
    std::fflush(to_);
    return;
  }
  // Plain lines: every `every` requests (agents while populating: ten lines
  // at most) and at the end.
  auto every = p.step == job_progress::phase::populate
                   ? std::max<uint64_t>(1, (p.total + 9) / 10)
                   : std::max(every_, p.total / 20);
  auto mark = p.done / every;
  if (!finished && (p.done % every != 0 || mark == last_step_))
    return;
  last_step_ = mark;
  std::fprintf(to_, "%s\n", line(p, now).c_str());
  std::fflush(to_);
}

} // namespace dualpath::cmd
