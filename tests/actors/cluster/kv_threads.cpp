// ctest-label: engines
// The CPU class of a node's KV work threads outside the bulk transport (the
// storage readers' I/O threads, the host GPU streams' copy threads): read
// from transport.tcp_kv_sched / tcp_kv_nice into the cluster spec, and
// applied by kv_thread_start() on the thread that runs it (name, scheduling
// policy and niceness, read back from the kernel). The default puts them at
// SCHED_IDLE, below the CAF threads that carry control messages.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "actors/cluster/cluster.hpp"
#include "config/settings.hpp"

using namespace dualpath::actors;
using dualpath::transport::bulk::tcp_cpu_sched;

namespace {

dualpath::config::settings
load_cfg(std::vector<dualpath::config::override_entry> overrides) {
  dualpath::config::load_request req;
  req.overrides = std::move(overrides);
  auto cfg = dualpath::config::load(req);
  REQUIRE(cfg);
  return std::move(*cfg);
}

struct thread_view {
  caf::error err;
  int policy = -1;
  int nice = 0;
  std::string comm;
};

// Runs the hook on a fresh thread and reads back what the kernel says.
thread_view on_thread(const std::function<caf::error()>& hook) {
  std::promise<thread_view> p;
  std::thread t{[&] {
    thread_view v;
    v.err = hook();
    v.policy = ::sched_getscheduler(0);
    auto tid = ::syscall(SYS_gettid);
    v.nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    std::ifstream in{"/proc/self/task/" + std::to_string(tid) + "/comm"};
    std::getline(in, v.comm);
    p.set_value(std::move(v));
  }};
  auto v = p.get_future().get();
  t.join();
  return v;
}

} // namespace

TEST_CASE("the spec takes the kv threads' class from transport.tcp_kv_*") {
  auto def = cluster::spec_from(load_cfg({}), load_mode::dualpath);
  REQUIRE(def);
  CHECK(def->kv_thread_sched == tcp_cpu_sched::idle);
  auto cfg =
      load_cfg({{"transport.tcp_kv_sched=batch"}, {"transport.tcp_kv_nice=5"}});
  auto spec = cluster::spec_from(cfg, load_mode::dualpath);
  REQUIRE(spec);
  CHECK(spec->kv_thread_sched == tcp_cpu_sched::batch);
  CHECK(spec->kv_thread_nice == 5);
}

TEST_CASE("kv_thread_start names the thread and puts it below control") {
  cluster::cluster_spec spec;
  // The default: SCHED_IDLE, only the time no other thread wants.
  auto idle = on_thread(cluster::kv_thread_start(spec, "dp-kv-io"));
  REQUIRE(!idle.err);
  CHECK(idle.policy == SCHED_IDLE);
  CHECK(idle.comm == "dp-kv-io");
  spec.kv_thread_sched = tcp_cpu_sched::batch;
  spec.kv_thread_nice = 6;
  auto batch = on_thread(cluster::kv_thread_start(spec, "dp-kv-gpu"));
  REQUIRE(!batch.err);
  CHECK(batch.policy == SCHED_BATCH);
  CHECK(batch.nice == 6);
  CHECK(batch.comm == "dp-kv-gpu");
  // normal at niceness 0 leaves the thread as an ordinary one.
  spec.kv_thread_sched = tcp_cpu_sched::normal;
  spec.kv_thread_nice = 0;
  auto normal = on_thread(cluster::kv_thread_start(spec, "dp-kv-io"));
  REQUIRE(!normal.err);
  CHECK(normal.policy == SCHED_OTHER);
  CHECK(normal.nice == 0);
}
