#include "transport/bulk/tcp_class_policy.hpp"

#include <netinet/in.h>
#include <netinet/ip.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <future>

#include "transport/bulk/tcp_socket.hpp"

namespace dualpath::transport::bulk {

caf::error apply_socket_policy(int fd, const options& opts, traffic_class tc) {
  bool ctl = tc == traffic_class::control;
  int tos = ctl ? opts.tcp_tos_control : opts.tcp_tos_kv;
  int prio = ctl ? opts.tcp_priority_control : opts.tcp_priority_kv;
  if (auto err =
          sys_check("setsockopt(IP_TOS)",
                    ::setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos))))
    return err;
  return sys_check(
      "setsockopt(SO_PRIORITY)",
      ::setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio)));
}

caf::error apply_thread_policy(const options& opts, traffic_class tc,
                               const char* name) {
  // pthread_setname_np returns the error number instead of setting errno.
  if (auto rc = ::pthread_setname_np(::pthread_self(), name); rc != 0)
    return sys_error("pthread_setname_np", rc);
  auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  auto set_nice = [&](int nice) {
    return sys_check("setpriority", ::setpriority(PRIO_PROCESS, tid, nice));
  };
  if (tc == traffic_class::control) {
    if (opts.tcp_control_cpu >= 0) {
      // pthread_setaffinity_np returns the error number; a CPU beyond the
      // set's size is one no process may use.
      int rc = EINVAL;
      if (opts.tcp_control_cpu < CPU_SETSIZE) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(opts.tcp_control_cpu, &one);
        rc = ::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one);
      }
      if (rc != 0)
        return sys_error("pthread_setaffinity_np(transport.tcp_control_cpu)",
                         rc);
    }
    return opts.tcp_control_nice == 0 ? caf::none
                                      : set_nice(opts.tcp_control_nice);
  }
  sched_param param{};
  switch (opts.tcp_kv_sched) {
    case tcp_cpu_sched::idle:
      // pid 0: the calling thread.
      return sys_check("sched_setscheduler(SCHED_IDLE)",
                       ::sched_setscheduler(0, SCHED_IDLE, &param));
    case tcp_cpu_sched::batch:
      if (auto err = sys_check("sched_setscheduler(SCHED_BATCH)",
                               ::sched_setscheduler(0, SCHED_BATCH, &param)))
        return err;
      return set_nice(opts.tcp_kv_nice);
    case tcp_cpu_sched::normal:
      return opts.tcp_kv_nice == 0 ? caf::none : set_nice(opts.tcp_kv_nice);
  }
  return caf::none;
}

caf::error start_class_thread(std::thread& out, const options& opts,
                              traffic_class tc, const char* name,
                              std::function<void()> body) {
  std::promise<caf::error> started;
  auto ready = started.get_future();
  out = std::thread{[&opts, tc, name, &started, body = std::move(body)] {
    auto err = apply_thread_policy(opts, tc, name);
    bool ok = !err;
    started.set_value(std::move(err)); // `started` ends with this call
    if (ok)
      body();
  }};
  auto err = ready.get();
  if (err)
    out.join();
  return err;
}

namespace {

/// One full kv system call: tcp_kv_chunk_kib, at least 4 KiB.
size_t kv_call_bytes(const options& opts) {
  return std::max<size_t>(size_t{opts.tcp_kv_chunk_kib} << 10, 4096);
}

} // namespace

size_t receive_wait_cap(const options& opts, traffic_class tc) {
  if (tc == traffic_class::control)
    return size_t{512} * 1024;
  return kv_call_bytes(opts);
}

size_t syscall_chunk(tcp_context& ctx, traffic_class tc, size_t fallback,
                     int64_t now_ns) {
  if (tc == traffic_class::control)
    return fallback;
  const auto& o = ctx.opts;
  auto full = kv_call_bytes(o);
  auto window =
      std::chrono::duration_cast<std::chrono::nanoseconds>(o.tcp_kv_yield)
          .count();
  auto last = ctx.last_control_ns();
  if (window <= 0 || last == INT64_MIN || now_ns - last > window)
    return full;
  auto yield = std::max<size_t>(size_t{o.tcp_kv_yield_chunk_kib} << 10, 4096);
  if (yield >= full)
    return full;
  ctx.stats.kv_yield_calls += 1;
  return yield;
}

} // namespace dualpath::transport::bulk
