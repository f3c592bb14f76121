// ctest-label: transport
// How the OS treats each traffic class, read back from the kernel: a socket
// carries the class's IP TOS byte and SO_PRIORITY (getsockopt); a thread gets
// its name and the class's scheduling policy and niceness
// (sched_getscheduler, getpriority); kv system calls are bounded.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <netinet/ip.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/thread_sched.hpp"
#include "transport/bulk/tcp_class_policy.hpp"
#include "transport/bulk/tcp_socket.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::bulk;

namespace {

int sockopt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof(v);
  REQUIRE(::getsockopt(fd, level, name, &v, &len) == 0);
  return v;
}

// The calling thread's view after apply_thread_policy on a fresh thread.
dualpath::test::thread_view run_policy(const options& o, traffic_class tc,
                                       const char* name) {
  return dualpath::test::on_new_thread(
      [&] { return apply_thread_policy(o, tc, name); });
}

} // namespace

TEST_CASE("sockets carry their class's TOS byte and SO_PRIORITY") {
  options o;
  o.tcp_tos_control = 0xb8;
  o.tcp_priority_control = 6;
  o.tcp_tos_kv = 0x20;
  o.tcp_priority_kv = 1;
  for (auto tc : {traffic_class::control, traffic_class::kv}) {
    auto fd = tcp_socket();
    REQUIRE(fd);
    REQUIRE(!apply_socket_policy(fd->get(), o, tc));
    bool ctl = tc == traffic_class::control;
    CHECK(sockopt(fd->get(), IPPROTO_IP, IP_TOS) == (ctl ? 0xb8 : 0x20));
    CHECK(sockopt(fd->get(), SOL_SOCKET, SO_PRIORITY) == (ctl ? 6 : 1));
  }
  // A call the kernel refuses is an error naming it.
  auto err = apply_socket_policy(-1, o, traffic_class::kv);
  REQUIRE(err);
  CHECK(static_cast<transport_errc>(err.code())
        == transport_errc::system_error);
  CHECK(to_string(err).find("IP_TOS") != std::string::npos);
}

TEST_CASE("kv threads run at the configured lowest priority, control ahead") {
  options o;
  o.tcp_kv_sched = tcp_cpu_sched::idle;
  auto kv = run_policy(o, traffic_class::kv, "dp-test-kv");
  REQUIRE(!kv.err);
  CHECK(kv.policy == SCHED_IDLE);
  CHECK(kv.comm == "dp-test-kv");

  o.tcp_kv_sched = tcp_cpu_sched::batch;
  o.tcp_kv_nice = 7;
  auto batch = run_policy(o, traffic_class::kv, "dp-test-batch");
  REQUIRE(!batch.err);
  CHECK(batch.policy == SCHED_BATCH);
  CHECK(batch.nice == 7);

  o.tcp_kv_sched = tcp_cpu_sched::normal;
  o.tcp_kv_nice = 3;
  auto normal = run_policy(o, traffic_class::kv, "dp-test-normal");
  REQUIRE(!normal.err);
  CHECK(normal.policy == SCHED_OTHER);
  CHECK(normal.nice == 3);

  // Control keeps the process's scheduling (nice 0 here) unless told.
  auto ctl = run_policy(o, traffic_class::control, "dp-test-ctl");
  REQUIRE(!ctl.err);
  CHECK(ctl.policy == SCHED_OTHER);
  CHECK(ctl.nice == ::getpriority(PRIO_PROCESS, 0));
  o.tcp_control_nice = 2;
  auto ctl2 = run_policy(o, traffic_class::control, "dp-test-ctl2");
  REQUIRE(!ctl2.err);
  CHECK(ctl2.nice == 2);
}

namespace {

/// The CPUs `tid` (0: the calling thread) may run on.
std::vector<int> cpus_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(tid, sizeof(set), &set) == 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set))
      out.push_back(c);
  return out;
}

} // namespace

TEST_CASE("tcp_control_cpu pins control threads to that CPU, not kv ones") {
  auto all = cpus_of(0);
  REQUIRE(!all.empty());
  options o;
  o.tcp_kv_sched = tcp_cpu_sched::normal;
  o.tcp_kv_nice = 0;
  o.tcp_control_cpu = all.back();
  // The CPUs a new thread may use after the class's policy was applied.
  auto cpus_after = [&](traffic_class tc) {
    std::vector<int> cpus;
    auto v = dualpath::test::on_new_thread([&] {
      auto err = apply_thread_policy(o, tc, "t-policy");
      cpus = cpus_of(0);
      return err;
    });
    REQUIRE(!v.err);
    return cpus;
  };
  CHECK(cpus_after(traffic_class::control) == std::vector<int>{all.back()});
  CHECK(cpus_after(traffic_class::kv) == all);
  // -1 (the default) leaves the mask alone.
  o.tcp_control_cpu = -1;
  CHECK(cpus_after(traffic_class::control) == all);
}

TEST_CASE("a tcp_control_cpu the process may not use is an error naming the "
          "key") {
  options o;
  for (int cpu : {CPU_SETSIZE - 1, CPU_SETSIZE + 7}) {
    CAPTURE(cpu);
    o.tcp_control_cpu = cpu;
    auto v = run_policy(o, traffic_class::control, "t-ctl");
    REQUIRE(v.err);
    CHECK(to_string(v.err).find("transport.tcp_control_cpu")
          != std::string::npos);
  }
}

TEST_CASE("a thread name the kernel refuses is an error naming the call") {
  options o;
  auto v = run_policy(o, traffic_class::control,
                      "a-name-longer-than-fifteen-characters");
  REQUIRE(v.err);
  CHECK(to_string(v.err).find("pthread_setname_np") != std::string::npos);
}

TEST_CASE("kv system calls are bounded, control ones are not") {
  options o;
  o.tcp_kv_chunk_kib = 128;
  {
    tcp_context ctx{o};
    CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, 0) == 128 * 1024);
    CHECK(syscall_chunk(ctx, traffic_class::control, 1 << 20, 0) == 1 << 20);
  }
  o.tcp_kv_chunk_kib = 1;
  tcp_context small{o};
  CHECK(syscall_chunk(small, traffic_class::kv, 1 << 20, 0) == 4096);
  CHECK(small.stats.kv_yield_calls == 0);
}

TEST_CASE("a kv receiver waits for one full kv call of its sender") {
  options o;
  for (uint32_t kib : {4u, 64u, 512u, 4096u}) {
    o.tcp_kv_chunk_kib = kib;
    tcp_context ctx{o};
    CHECK(receive_wait_cap(o, traffic_class::kv)
          == syscall_chunk(ctx, traffic_class::kv, 1 << 30, 0));
  }
  o.tcp_kv_chunk_kib = 1;
  CHECK(receive_wait_cap(o, traffic_class::kv) == 4096);
  CHECK(receive_wait_cap(o, traffic_class::control) == 512 * 1024);
}

TEST_CASE("kv system calls shrink for tcp_kv_yield after control traffic") {
  using namespace std::chrono_literals;
  options o;
  o.tcp_kv_chunk_kib = 256;
  o.tcp_kv_yield_chunk_kib = 32;
  o.tcp_kv_yield = 10ms;
  tcp_context ctx{o};
  const int64_t ms = 1'000'000;
  const int64_t t0 = 5'000 * ms;
  // Never any control: full calls.
  CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, t0) == 256 * 1024);
  ctx.note_control(t0);
  CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, t0) == 32 * 1024);
  CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, t0 + 10 * ms)
        == 32 * 1024);
  // A control thread's clock read a little later than ours: still short.
  CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, t0 - ms) == 32 * 1024);
  CHECK(ctx.stats.kv_yield_calls == 3);
  // The window over: full calls again; control is never held short.
  CHECK(syscall_chunk(ctx, traffic_class::kv, 1 << 20, t0 + 10 * ms + 1)
        == 256 * 1024);
  CHECK(syscall_chunk(ctx, traffic_class::control, 1 << 20, t0) == 1 << 20);
  CHECK(ctx.stats.kv_yield_calls == 3);

  // A yield chunk at or above the full one changes nothing (and is not
  // counted); a window of 0 turns the shrinking off.
  o.tcp_kv_yield_chunk_kib = 512;
  tcp_context big{o};
  big.note_control(t0);
  CHECK(syscall_chunk(big, traffic_class::kv, 1 << 20, t0) == 256 * 1024);
  CHECK(big.stats.kv_yield_calls == 0);
  o.tcp_kv_yield_chunk_kib = 32;
  o.tcp_kv_yield = 0ms;
  tcp_context off{o};
  off.note_control(t0);
  CHECK(syscall_chunk(off, traffic_class::kv, 1 << 20, t0) == 256 * 1024);
  CHECK(off.stats.kv_yield_calls == 0);
}
