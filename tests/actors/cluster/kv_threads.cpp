// ctest-label: engines
// The CPU class of a node's KV work threads outside the bulk transport (the
// storage readers' I/O threads, the host GPU streams' copy threads): read
// from transport.tcp_kv_sched / tcp_kv_nice into the cluster spec, and
// applied by kv_thread_start() on the thread that runs it (name, scheduling
// policy and niceness, read back from the kernel). The default puts them at
// SCHED_IDLE, below the CAF threads that carry control messages.
#include <doctest/doctest.h>

#include <sched.h>

#include "actors/cluster/cluster.hpp"
#include "tests/support/settings.hpp"
#include "tests/support/thread_sched.hpp"

using namespace dualpath::actors;
using dualpath::transport::bulk::tcp_cpu_sched;

using dualpath::test::on_new_thread;
using dualpath::test::settings_with;

TEST_CASE("the spec takes the kv threads' class from transport.tcp_kv_*") {
  auto def = cluster::spec_from(settings_with({}), load_mode::dualpath);
  REQUIRE(def);
  CHECK(def->kv_thread_sched == tcp_cpu_sched::idle);
  auto cfg = settings_with(
      {{"transport.tcp_kv_sched=batch"}, {"transport.tcp_kv_nice=5"}});
  auto spec = cluster::spec_from(cfg, load_mode::dualpath);
  REQUIRE(spec);
  CHECK(spec->kv_thread_sched == tcp_cpu_sched::batch);
  CHECK(spec->kv_thread_nice == 5);
}

TEST_CASE("kv_thread_start names the thread and puts it below control") {
  cluster::cluster_spec spec;
  // The default: SCHED_IDLE, only the time no other thread wants.
  auto idle = on_new_thread(cluster::kv_thread_start(spec, "dp-kv-io"));
  REQUIRE(!idle.err);
  CHECK(idle.policy == SCHED_IDLE);
  CHECK(idle.comm == "dp-kv-io");
  spec.kv_thread_sched = tcp_cpu_sched::batch;
  spec.kv_thread_nice = 6;
  auto batch = on_new_thread(cluster::kv_thread_start(spec, "dp-kv-gpu"));
  REQUIRE(!batch.err);
  CHECK(batch.policy == SCHED_BATCH);
  CHECK(batch.nice == 6);
  CHECK(batch.comm == "dp-kv-gpu");
  // normal at niceness 0 leaves the thread as an ordinary one.
  spec.kv_thread_sched = tcp_cpu_sched::normal;
  spec.kv_thread_nice = 0;
  auto normal = on_new_thread(cluster::kv_thread_start(spec, "dp-kv-io"));
  REQUIRE(!normal.err);
  CHECK(normal.policy == SCHED_OTHER);
  CHECK(normal.nice == 0);
}
