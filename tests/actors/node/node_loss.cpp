// ctest-label: distribution
// ctest-serial: a deployment of real-time processes (scheduler and three nodes)
// Node loss in a deployment of real processes on 127.0.0.1 (scheduler node,
// one prefill node, two decode nodes): a decode process or the prefill
// process killed with SIGKILL mid-run; every agent still completes, every
// block verifies, the report counts the rerouted requests and none failed
// (a result is counted once); a node started again under its name joins again
// and is used again. When every decode node dies, or the scheduler node, the
// driver fails within seconds naming what was lost (not at
// run.wall_limit_s).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/actors/node/deployment.hpp"

#include <chrono>

using namespace dualpath::test;
using nlohmann::json;

TEST_CASE("kill -9 of a decode node mid-run: every agent completes once") {
  temp_dir dir;
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  write_file(cluster, cluster_toml(ports, dir.file("store"), false));
  // Enough work that both decode nodes hold requests when one dies.
  auto settings = deployment_settings(16, 3, 10);
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());
  // Plaintext only when configured, and never silently.
  CHECK(d.node(0).err().find("WARNING: tls.mode = \"plaintext\"")
        != std::string::npos);
  background_process run{
      with({dualpath_binary(), "run", "--json", "--cluster", cluster},
           settings),
      dir.file("run.out"), dir.file("run.err")};
  // Kill de1 once the first requests completed (progress every 16).
  REQUIRE_MESSAGE(run.wait_err("requests 16/", std::chrono::seconds(240)),
                  (run.err() + d.logs()));
  d.node(3).signal(SIGKILL);
  CHECK(d.node(3).wait() == 128 + SIGKILL);
  auto status = run.wait_for(std::chrono::seconds(300));
  REQUIRE_MESSAGE(status == 0, (run.err() + d.logs()));
  auto got = parse_report(run.out())["modes"]["dualpath"];
  CHECK(got["requests"].get<int>() == 48);
  CHECK(got["failed_requests"] == 0);
  CHECK(got["verify_failures"] == 0);
  CHECK(got["reroutes"].get<int>() > 0);
  MESSAGE("rerouted requests: " << got["reroutes"]);
  // The scheduler node saw de1 go.
  CHECK(d.node(0).out().find("node de1 left the cluster") != std::string::npos);
  // de1 comes back under its name: it joins again and the next job runs on
  // the whole cluster.
  d.restart(3);
  REQUIRE_MESSAGE(d.node(3).wait_err("joined", std::chrono::seconds(30)),
                  d.logs());
  auto again = run_process(with(
      {dualpath_binary(), "run", "--quiet", "--json", "--cluster", cluster},
      with(settings, {"--set", "workload.agents=4", "--set", "run.turns=1"})));
  REQUIRE_MESSAGE(again.status == 0, (again.err + d.logs()));
  auto second = parse_report(again.out)["modes"]["dualpath"];
  CHECK(second["requests"].get<int>() == 4);
  CHECK(second["failed_requests"] == 0);
  CHECK(second["verify_failures"] == 0);
  auto sched_log = d.node(0).out();
  auto first = sched_log.find("node de1 joined");
  REQUIRE(first != std::string::npos);
  CHECK(sched_log.find("node de1 joined", first + 1) != std::string::npos);
}

TEST_CASE("kill -9 of the prefill node mid-run: it comes back, every agent "
          "completes once") {
  temp_dir dir;
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  write_file(cluster, cluster_toml(ports, dir.file("store"), false));
  auto settings = deployment_settings(16, 3, 10);
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());
  // The driver waits out the restart (under ASan a node takes seconds to
  // start) instead of failing after run.role_loss_grace_s without a prefill
  // engine.
  background_process run{
      with({dualpath_binary(), "run", "--json", "--cluster", cluster},
           with(settings, {"--set", "run.role_loss_grace_s=120"})),
      dir.file("run.out"), dir.file("run.err")};
  REQUIRE_MESSAGE(run.wait_err("requests 16/", std::chrono::seconds(240)),
                  (run.err() + d.logs()));
  // The only prefill node dies with requests in flight; decode engines drop
  // what it had not finished sending, the scheduler re-queues its requests.
  d.node(1).signal(SIGKILL);
  CHECK(d.node(1).wait() == 128 + SIGKILL);
  d.restart(1);
  auto status = run.wait_for(std::chrono::seconds(300));
  REQUIRE_MESSAGE(status == 0, (run.err() + d.logs()));
  auto got = parse_report(run.out())["modes"]["dualpath"];
  CHECK(got["requests"].get<int>() == 48);
  CHECK(got["failed_requests"] == 0);
  CHECK(got["verify_failures"] == 0);
  CHECK(got["reroutes"].get<int>() > 0);
  MESSAGE("rerouted requests: " << got["reroutes"]);
  CHECK(d.node(0).out().find("node pe0 left the cluster") != std::string::npos);
}

namespace {

// What the driver did after nodes were killed under it.
struct driver_exit {
  int status = 0;
  double after_s = 0; ///< From the kill to the driver's exit.
  std::string err;    ///< Its stderr.
};

// Starts a job on a fresh deployment and kills the nodes `victims` once 16
// requests completed.
driver_exit kill_mid_job(const std::vector<size_t>& victims) {
  temp_dir dir;
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  write_file(cluster, cluster_toml(ports, dir.file("store"), false));
  auto settings = deployment_settings(16, 3, 10);
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());
  background_process run{
      with({dualpath_binary(), "run", "--json", "--cluster", cluster},
           settings),
      dir.file("run.out"), dir.file("run.err")};
  REQUIRE_MESSAGE(run.wait_err("requests 16/", std::chrono::seconds(240)),
                  (run.err() + d.logs()));
  auto killed = std::chrono::steady_clock::now();
  for (auto i : victims)
    d.node(i).signal(SIGKILL);
  for (auto i : victims)
    CHECK(d.node(i).wait() == 128 + SIGKILL);
  // run.wall_limit_s is 600 s: without the watch the driver is still
  // waiting when this limit kills it.
  driver_exit x;
  x.status = run.wait_for(std::chrono::seconds(60));
  x.after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed)
          .count();
  x.err = run.err();
  MESSAGE("driver exited " << x.after_s << " s after the kill, status "
                           << x.status);
  return x;
}

} // namespace

TEST_CASE("every decode node killed mid-job: the driver fails at once naming "
          "the lost role") {
  auto x = kill_mid_job({2, 3});
  CHECK_MESSAGE(x.status == 1, x.err);
  CHECK_MESSAGE(x.err.find("every decode engine left the cluster view (last: ")
                    != std::string::npos,
                x.err);
  CHECK_MESSAGE(x.err.find("the job cannot finish") != std::string::npos,
                x.err);
  CHECK_MESSAGE(x.err.find("requests completed") != std::string::npos, x.err);
  // run.role_loss_grace_s (5 s) plus the watch's polls, not 600 s.
  CHECK(x.after_s < 30);
}

TEST_CASE("the scheduler node killed mid-job: the driver fails at once") {
  auto x = kill_mid_job({0});
  CHECK_MESSAGE(x.status == 1, x.err);
  CHECK_MESSAGE(
      x.err.find("lost the scheduler node sched") != std::string::npos, x.err);
  CHECK(x.after_s < 30);
}
