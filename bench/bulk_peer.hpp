// Helpers shared by bench_transport, bench_verbs and bench_qos: a tcp bulk
// receiver in a forked child process (a second process on loopback, as
// between two nodes), a stream of writes posted from completions, and
// median/spread statistics.
//
// Thread safety: fork_receiver must run before the parent starts threads.
#pragma once

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "config/errors.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::bench {

/// Which bytes a throughput workload's writes touch: `cycling` walks large
/// source and destination regions (as KV blocks land), `same_bytes` writes
/// from and to one message-sized buffer (the working set of iperf3,
/// ucx_perftest and ib_write_bw).
enum class working_set { cycling, same_bytes };

/// What a stream of writes moved: its bytes, and the first failure (empty
/// when every write succeeded).
struct stream_result {
  uint64_t bytes = 0;
  std::string failure;
};

/// Writes of `size` bytes from `src` to `dst` (kv class), `window` in
/// flight, each from and to the next `size` bytes of regions of
/// `region_len` (`cycling`) or the first `size` (`same_bytes`), for as long
/// as `more()` holds (asked once per write, under a lock) and no write
/// failed. The first window is posted here, every later write from the
/// completion of an earlier one (on the backend's thread, as the peers'
/// single loops post from theirs); returns once the last write completed,
/// which is the only completion that wakes the caller: a wake-up per write
/// would charge the harness's own context switches to the backend.
template <class More>
stream_result stream_writes(transport::bulk::backend& be,
                            const transport::bulk::local_registration& src,
                            const transport::remote_region& dst, uint64_t size,
                            working_set ws, uint64_t region_len, int window,
                            More more) {
  struct state {
    std::mutex mtx;
    std::condition_variable cv;
    uint64_t posted = 0;
    uint64_t done = 0;
    bool ended = false; ///< more() said no, or a write failed.
    stream_result result;
  } st;
  const uint64_t slots = ws == working_set::same_bytes ? 1 : region_len / size;
  std::function<void()> post_one = [&] {
    uint64_t next = 0;
    {
      std::lock_guard<std::mutex> g{st.mtx};
      if (st.ended || !more()) {
        st.ended = true;
        return;
      }
      next = st.posted++;
    }
    transport::bulk::batch b;
    b.tclass = transport::traffic_class::kv;
    auto off = (next % slots) * size;
    b.writes.push_back({&src, off, *dst.subrange(off, size)});
    be.post(std::move(b), [&](transport::bulk::completion c) {
      {
        std::lock_guard<std::mutex> g{st.mtx};
        if (c.error && st.result.failure.empty()) {
          st.result.failure = config::message_of(c.error);
          st.ended = true;
        } else if (!c.error) {
          st.result.bytes += c.bytes;
        }
      }
      post_one(); // before this one counts as done: the waiter stays
      std::lock_guard<std::mutex> g{st.mtx};
      if (++st.done == st.posted && st.ended)
        st.cv.notify_all(); // the last touch of st
    });
  };
  for (int i = 0; i < window; ++i)
    post_one();
  std::unique_lock<std::mutex> guard{st.mtx};
  st.cv.wait(guard, [&] { return st.done == st.posted && st.ended; });
  return st.result;
}

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

/// Forks the receiver; `o` are its tcp options (node becomes "receiver").
/// What a receiver child tells its parent on the pipe: how to reach it and
/// where its region is ("<details for the sender> <region id> <key>
/// <base>\n").
inline std::string
receiver_line(transport::bulk::backend& be,
              const transport::bulk::local_registration& reg) {
  auto d = be.details_for("sender");
  std::string msg{d->begin(), d->end()};
  msg += " " + std::to_string(reg.id()) + " "
         + std::to_string(reg.describe().key) + " "
         + std::to_string(reg.describe().base) + "\n";
  return msg;
}

/// The line a child wrote on `fd`, up to its newline; closes `fd`.
inline std::string read_line(int fd) {
  std::string line;
  char ch;
  while (::read(fd, &ch, 1) == 1 && ch != '\n')
    line += ch;
  ::close(fd);
  return line;
}

inline bool fork_receiver(uint64_t len, transport::bulk::options o,
                          receiver_process& out) {
  int fds[2];
  if (::pipe(fds) != 0)
    return false;
  out.pid = ::fork();
  if (out.pid < 0)
    return false;
  if (out.pid == 0) {
    ::close(fds[0]);
    o.node = "receiver";
    auto be = transport::bulk::make_tcp_backend(o);
    if (!be)
      _exit(1);
    std::vector<uint8_t> buf(len, 0);
    auto reg = (*be)->register_region(buf.data(), buf.size());
    if (!reg)
      _exit(1);
    auto msg = receiver_line(**be, *reg);
    if (::write(fds[1], msg.data(), msg.size()) < 0)
      _exit(1);
    for (;;)
      ::pause();
  }
  ::close(fds[1]);
  std::istringstream in{read_line(fds[0])};
  in >> out.address >> out.region.region_id >> out.region.key
      >> out.region.base;
  out.region.node = "receiver";
  out.region.length = len;
  return !out.address.empty();
}

/// Applies a bench flag that names a tcp option (`--kv-sched idle|batch|
/// normal`, `--kv-nice N`, `--control-nice N`, `--control-cpu N`,
/// `--kv-chunk-kib N`,
/// `--kv-yield-chunk-kib N`, `--kv-yield-ms N`, `--slice-kib N`,
/// `--kv-spin-us N`, `--kv-connections N`); false when
/// `key` is none of them.
inline bool tcp_option_flag(const std::string& key, const std::string& value,
                            transport::bulk::options& o) {
  if (key == "--kv-sched") {
    if (!transport::bulk::from_string(value, o.tcp_kv_sched))
      return false;
  } else if (key == "--kv-nice") {
    o.tcp_kv_nice = std::atoi(value.c_str());
  } else if (key == "--control-cpu") {
    o.tcp_control_cpu = std::atoi(value.c_str());
  } else if (key == "--control-nice") {
    o.tcp_control_nice = std::atoi(value.c_str());
  } else if (key == "--kv-chunk-kib") {
    o.tcp_kv_chunk_kib = static_cast<uint32_t>(std::atoi(value.c_str()));
  } else if (key == "--kv-yield-chunk-kib") {
    o.tcp_kv_yield_chunk_kib = static_cast<uint32_t>(std::atoi(value.c_str()));
  } else if (key == "--kv-yield-ms") {
    o.tcp_kv_yield = std::chrono::milliseconds{std::atoi(value.c_str())};
  } else if (key == "--slice-kib") {
    o.slice_kib = static_cast<uint64_t>(std::atoi(value.c_str()));
  } else if (key == "--kv-connections") {
    o.tcp_kv_connections = static_cast<uint32_t>(std::atoi(value.c_str()));
  } else if (key == "--kv-spin-us") {
    o.tcp_kv_spin = std::chrono::microseconds{std::atoi(value.c_str())};
  } else {
    return false;
  }
  return true;
}

/// Pins the calling thread to `cpu` (threads it starts afterwards inherit
/// the mask); false when the kernel refuses.
inline bool pin_calling_thread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return false;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return ::sched_setaffinity(0, sizeof(one), &one) == 0;
}

/// CPU seconds (user + system) process `pid` has used so far.
inline double cpu_seconds(pid_t pid) {
  auto path = "/proc/" + std::to_string(pid) + "/stat";
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    return 0;
  char buf[1024];
  auto n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Fields after the command name, which is in parentheses: state is
  // field 3; utime and stime are fields 14 and 15.
  const char* p = std::strrchr(buf, ')');
  if (!p)
    return 0;
  std::istringstream in{p + 2};
  std::string skip;
  for (int i = 3; i < 14; ++i)
    in >> skip;
  double ut = 0, st = 0;
  in >> ut >> st;
  return (ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
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
