// ctest-label: distribution
// ctest-serial: a deployment of real-time processes (scheduler and three nodes)
// What a deployment's nodes show of themselves (observe.* on `dualpath
// node`), with real processes on 127.0.0.1: each node answers a scrape of
// its own metrics endpoint with its own process's series, whose counters
// moved during a job driven by `dualpath run --cluster`; each node with
// observe.trace_file writes a valid Chrome trace of its own requests' spans
// when it stops, on its own SIGTERM or when the scheduler node is stopped. And
// a job driven a while after the nodes started reports its emulated times from
// its own start: waiting before driving it does not inflate its JCT or TTFT.
#include <doctest/doctest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "tests/actors/node/deployment.hpp"

using namespace dualpath::test;
using nlohmann::json;

namespace {

const char* const node_names[] = {"sched", "pe0", "de0", "de1"};

// The value of the sample `series` (name with its labels, as rendered) in a
// scrape of 127.0.0.1:`port`/metrics; -1 when the series is absent, -2 when
// the scrape failed.
double scrape(const temp_dir& dir, uint16_t port, const std::string& series) {
  auto file = dir.file("scrape-" + std::to_string(port) + ".txt");
  if (!shell("curl -sS --fail --max-time 5 -o '" + file
             + "' http://127.0.0.1:" + std::to_string(port) + "/metrics"))
    return -2;
  std::ifstream in{file};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0)
      return std::stod(line.substr(series.size() + 1));
  return -1;
}

// The requests that have a span called `name` in the trace file `path`
// (which must be valid trace-event JSON), on processes whose name ends with
// the node's name.
std::set<uint64_t> requests_with(const std::string& path,
                                 const std::string& node,
                                 const std::string& name) {
  std::ifstream in{path};
  REQUIRE_MESSAGE(in.good(), path << " was not written");
  auto doc = json::parse(in, nullptr, false);
  REQUIRE_MESSAGE(!doc.is_discarded(), path << " is not valid JSON");
  REQUIRE(doc.contains("traceEvents"));
  std::set<int64_t> pids; // processes of `node`
  for (auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      auto pname = e["args"].value("name", "");
      if (pname.size() >= node.size()
          && pname.compare(pname.size() - node.size(), node.size(), node) == 0)
        pids.insert(e["pid"].get<int64_t>());
      else
        FAIL_CHECK(path << " has a process of another node: " << pname);
    }
  std::set<uint64_t> out;
  for (auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("name", "") == name) {
      CHECK(pids.count(e["pid"].get<int64_t>()) == 1);
      CHECK(e["dur"].get<double>() >= 0);
      out.insert(e["args"]["request"].get<uint64_t>());
    }
  return out;
}

} // namespace

TEST_CASE("deployment nodes serve their metrics, write their timelines and "
          "time a job from its start") {
  loopback_cluster c;
  auto& dir = c.dir;
  auto& cluster = c.file;
  const double time_scale = 20;
  auto settings = deployment_settings(6, 2, time_scale);
  std::map<std::string, uint16_t> metrics;
  deployment::node_args own;
  for (auto* n : node_names) {
    metrics[n] = free_port();
    own[n] = {"--set", "observe.metrics_port=" + std::to_string(metrics[n]),
              "--set",
              "observe.trace_file=" + dir.file(std::string{n} + ".trace.json")};
  }
  deployment d{dir, cluster, settings, own};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());
  auto drive = [&](const std::string& seed) {
    auto res = run_process(
        with({dualpath_binary(), "run", "--quiet", "--json", "--cluster",
              cluster, "--set", "workload.seed=" + seed},
             settings));
    REQUIRE_MESSAGE(res.status == 0, (res.err + d.logs()));
    auto doc = parse_report(res.out);
    REQUIRE(doc["modes"].contains("dualpath"));
    auto got = doc["modes"]["dualpath"];
    CHECK(got["requests"].get<int>() == 12);
    CHECK(got["failed_requests"] == 0);
    CHECK(got["verify_failures"] == 0);
    // The control round trip across processes: measured, positive, a
    // fraction of the job's wall time.
    auto rtt_p99 = got["control_rtt_p99_ms"].get<double>();
    CHECK(got["control_rtt_p50_ms"].get<double>() > 0);
    CHECK(rtt_p99 >= got["control_rtt_p50_ms"].get<double>());
    CHECK(rtt_p99 < doc["wall_s"].get<double>() * 1e3);
    // Emulated time runs time_scale times as fast as the wall clock: no
    // job can take longer, emulated, than the driver's wall time allows.
    CHECK(got["jct_s"].get<double>()
          <= doc["wall_s"].get<double>() * time_scale);
    return got;
  };
  const std::string pe0_blocks =
      R"(dualpath_storage_blocks_read_total{mode="dualpath",node="pe0"})";
  // Before any job: the endpoints answer, nothing was read yet.
  auto before = scrape(dir, metrics["pe0"], pe0_blocks);
  CHECK_MESSAGE(before > -2, d.logs());
  CHECK(before <= 0);
  auto first = drive("1");
  // The job's work shows on the endpoint of the process that did it.
  auto after = scrape(dir, metrics["pe0"], pe0_blocks);
  CHECK_MESSAGE(after > 0, d.logs());
  CHECK(scrape(dir, metrics["de0"], pe0_blocks) == -1);
  CHECK(scrape(
            dir, metrics["de0"],
            R"(dualpath_storage_blocks_read_total{mode="dualpath",node="de0"})")
        > 0);
  CHECK(scrape(dir, metrics["pe0"],
               R"(dualpath_prefill_layers_total{mode="dualpath",node="pe0"})")
        > 0);
  CHECK(scrape(dir, metrics["sched"],
               R"(dualpath_requests_submitted_total{mode="dualpath"})")
        == 12);
  // A job driven after a wait times itself from its own start: the wait
  // (seconds of wall time, x time_scale emulated) is not in its JCT or
  // TTFT. Another seed: a trace of its own, not the first job's hits.
  const int wait_s = 8;
  std::this_thread::sleep_for(std::chrono::seconds(wait_s));
  auto later = drive("2");
  MESSAGE("JCT " << first["jct_s"] << " s driven at once, " << later["jct_s"]
                 << " s driven " << wait_s << " s later");
  // Counted from the scheduler's start, the later job would carry the
  // wait: wait_s x time_scale emulated seconds more than a job of its size.
  // Compared with the first job (another trace of the same shape), not
  // with a fixed bound: under a sanitizer or a loaded host the jobs
  // themselves run longer than the wait (ASan: 260 s emulated).
  const double inflation = wait_s * time_scale;
  CHECK(later["jct_s"].get<double>() > 0);
  CHECK(later["jct_s"].get<double>()
        < first["jct_s"].get<double>() + inflation / 2);
  CHECK(later["ttft_p99_s"].get<double>()
        < first["ttft_p99_s"].get<double>() + inflation / 2);
  CHECK(scrape(dir, metrics["pe0"], pe0_blocks) > after);
  CHECK(scrape(dir, metrics["sched"],
               R"(dualpath_requests_submitted_total{mode="dualpath"})")
        == 24);
  // A clean stop writes each node's timeline: pe0 on its own SIGTERM, the
  // decode nodes when the scheduler node is stopped on purpose.
  d.node(1).signal(SIGTERM);
  CHECK_MESSAGE(d.node(1).wait_for(std::chrono::seconds(20)) == 0, d.logs());
  d.node(0).signal(SIGTERM);
  for (size_t i : {0, 2, 3})
    CHECK_MESSAGE(d.node(i).wait_for(std::chrono::seconds(20)) == 0, d.logs());
  CHECK((d.node(2).err() + d.node(2).out()).find("the scheduler node stopped")
        != std::string::npos);
  // Both jobs' requests (24) were prefilled on pe0 and decoded on de0 or
  // de1; every trace holds only its own node's processes.
  auto prefilled = requests_with(dir.file("pe0.trace.json"), "pe0", "prefill");
  CHECK(prefilled.size() == 24);
  auto decoded = requests_with(dir.file("de0.trace.json"), "de0", "decode");
  auto on_de1 = requests_with(dir.file("de1.trace.json"), "de1", "decode");
  CHECK_FALSE(decoded.empty());
  CHECK_FALSE(on_de1.empty());
  decoded.insert(on_de1.begin(), on_de1.end());
  CHECK(decoded == prefilled);
  CHECK(
      requests_with(dir.file("sched.trace.json"), "sched", "prefill").empty());
}

TEST_CASE("a node refuses a trace file it cannot write before it starts") {
  loopback_cluster c;
  auto res = run_process(
      with({dualpath_binary(), "node", "--cluster", c.file, "--name", "pe0",
            "--set", "observe.trace_file=" + c.dir.file("no/such/dir/t.json")},
           deployment_settings(2, 1, 20)));
  CHECK(res.status == 2);
  CHECK(res.err.find("observe.trace_file") != std::string::npos);
  CHECK(res.err.find("no/such/dir") != std::string::npos);
}
