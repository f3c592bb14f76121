// Helpers shared by bench_transport and bench_qos: a tcp bulk receiver in a
// forked child process (a second process on loopback, as between two nodes),
// and median/spread statistics.
//
// Thread safety: fork_receiver must run before the parent starts threads.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "transport/bulk/backend.hpp"

namespace dualpath::bench {

/// A child process serving one registered region of `len` bytes over tcp.
struct receiver_process {
  pid_t pid = -1;
  std::string address;
  transport::remote_region region;

  ~receiver_process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

inline bool fork_receiver(uint64_t len, const std::string& secret,
                          receiver_process& out) {
  int fds[2];
  if (::pipe(fds) != 0)
    return false;
  out.pid = ::fork();
  if (out.pid < 0)
    return false;
  if (out.pid == 0) {
    ::close(fds[0]);
    transport::bulk::options o;
    o.node = "receiver";
    o.secret = secret;
    if (auto nice = std::getenv("DUALPATH_KV_RX_NICE"))
      o.kv_rx_nice = std::atoi(nice);
    auto be = transport::bulk::make_tcp_backend(o);
    if (!be)
      _exit(1);
    std::vector<uint8_t> buf(len, 0);
    auto reg = (*be)->register_region(buf.data(), buf.size());
    if (!reg)
      _exit(1);
    auto d = (*be)->details_for("sender");
    std::string msg{d->begin(), d->end()};
    msg += " " + std::to_string(reg->id()) + " "
           + std::to_string(reg->describe().key) + " "
           + std::to_string(reg->describe().base) + "\n";
    if (::write(fds[1], msg.data(), msg.size()) < 0)
      _exit(1);
    for (;;)
      ::pause();
  }
  ::close(fds[1]);
  std::string line;
  char ch;
  while (::read(fds[0], &ch, 1) == 1 && ch != '\n')
    line += ch;
  ::close(fds[0]);
  std::istringstream in{line};
  in >> out.address >> out.region.region_id >> out.region.key
      >> out.region.base;
  out.region.node = "receiver";
  out.region.length = len;
  return !out.address.empty();
}

struct summary {
  double median = 0;
  double min = 0;
  double max = 0;
};

inline summary summarize(std::vector<double> xs) {
  summary s;
  if (xs.empty())
    return s;
  std::sort(xs.begin(), xs.end());
  s.min = xs.front();
  s.max = xs.back();
  auto n = xs.size();
  s.median = n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
  return s;
}

} // namespace dualpath::bench
