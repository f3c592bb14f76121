// How the operating system treats each traffic class of the tcp backend, so
// that KV bytes never delay control bytes even where the kv stream can fill
// every core: each class has its own sockets, marked with the class's IP TOS
// byte (DSCP, for switches) and SO_PRIORITY (the host's queueing
// disciplines), and its own sender and receive threads; the kv threads run at
// the lowest CPU priority (SCHED_IDLE by default) and control threads ahead of
// them, and a kv system call moves at most `tcp_kv_chunk_kib`, so a waking
// control thread preempts a kv thread within one short copy. A thread's
// wake-up waits for the copy in the kernel that the CPU is in to end, so the
// control tail grows with that copy's size: while control traffic was seen
// within `tcp_kv_yield_ms` (sent or received, in this process), kv calls
// move at most `tcp_kv_yield_chunk_kib` (docs/benchmarks.md, qos: the chunk
// sweep), and kv alone keeps the large, cheaper calls. Where the kernel does
// not preempt a thread in a system call (PREEMPT_NONE), a woken control
// thread still waits for the kv call on its CPU to end, one wait per
// thread of the control path; with `tcp_control_cpu` the control threads
// share one CPU, and each wake-up between them takes over the CPU its waker
// is about to leave instead.
//
// Thread safety: free functions; the thread functions act on the calling
// thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <thread>

#include <caf/error.hpp>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/tcp_context.hpp"

namespace dualpath::transport::bulk {

/// The class's IP TOS byte and SO_PRIORITY (in this order: setting the TOS
/// may reset the priority), on a connected or accepted socket.
caf::error apply_socket_policy(int fd, const options& opts, traffic_class tc);

/// Names the calling thread `name` (at most 15 characters, as
/// /proc/self/task/<tid>/comm shows it) and applies the class's scheduling:
/// control threads get `tcp_control_cpu` (when not -1) and
/// `tcp_control_nice` (when not 0), kv threads `tcp_kv_sched` and
/// `tcp_kv_nice`. Errors name the call (setpriority with a negative
/// niceness needs CAP_SYS_NICE; a CPU outside the process's set is EINVAL).
caf::error apply_thread_policy(const options& opts, traffic_class tc,
                               const char* name);

/// Starts a thread of class `tc` named `name`: it applies
/// apply_thread_policy, reports the result, and runs `body` only when that
/// succeeded. Returns once the policy is applied: the thread (running
/// `body`) or the error (the thread already joined).
caf::error start_class_thread(std::thread& out, const options& opts,
                              traffic_class tc, const char* name,
                              std::function<void()> body);

/// Bytes one system call of class `tc` may move at `now_ns` (clock_ns):
/// control: `fallback`; kv: tcp_kv_yield_chunk_kib while control traffic
/// was seen within tcp_kv_yield (counted in stats.kv_yield_calls),
/// tcp_kv_chunk_kib otherwise; never more than tcp_kv_chunk_kib, never
/// less than 4 KiB.
size_t syscall_chunk(tcp_context& ctx, traffic_class tc, size_t fallback,
                     int64_t now_ns);

/// The most payload bytes a receive thread of class `tc` waits for
/// (SO_RCVLOWAT) before it reads a connection: kv, one full kv system call
/// of the sender (tcp_kv_chunk_kib, at least 4 KiB; both ends read the
/// key), so the receiver wakes as a sender's call ends instead of taking
/// the socket from it amid one (docs/benchmarks.md, transport); control,
/// 512 KiB.
size_t receive_wait_cap(const options& opts, traffic_class tc);

} // namespace dualpath::transport::bulk
