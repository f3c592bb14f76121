// ctest-label: distribution
// ctest-serial: a deployment of real-time processes (scheduler and three nodes)
// A deployment of real processes on 127.0.0.1: a scheduler node, one prefill
// node and two decode nodes (`dualpath node`), driven by `dualpath run
// --cluster`. Over TLS with a throw-away CA made by openssl here, it gives the
// same verified results as the embedded run of the same trace and seed.
#include <doctest/doctest.h>

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/actors/node/deployment.hpp"

using namespace dualpath::test;
using nlohmann::json;

namespace {

// Thread name -> how many of process `pid`'s threads of that name run at
// SCHED_IDLE and how many do not.
std::map<std::string, std::pair<int, int>> thread_classes(pid_t pid) {
  std::map<std::string, std::pair<int, int>> out;
  auto dir = "/proc/" + std::to_string(pid) + "/task";
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::string comm;
    std::ifstream in{e.path() / "comm"};
    std::getline(in, comm);
    auto tid = static_cast<pid_t>(std::stol(e.path().filename().string()));
    auto& n = out[comm];
    (::sched_getscheduler(tid) == SCHED_IDLE ? n.first : n.second) += 1;
  }
  return out;
}

} // namespace

TEST_CASE("four processes over TLS give the embedded run's verified results") {
  temp_dir dir;
  if (!make_test_ca(dir.path()))
    skip_suite("distribution.multi_process", "the openssl command failed");
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  write_file(cluster, cluster_toml(ports, dir.file("store"), true));
  auto settings = deployment_settings(6, 2, 20);
  // The embedded run of the same trace and seed.
  auto embedded =
      run_process(with({dualpath_binary(), "run", "--quiet", "--json",
                        "--store-dir", dir.file("embedded-store")},
                       settings));
  REQUIRE_MESSAGE(embedded.status == 0, embedded.err);
  auto emb = parse_report(embedded.out)["modes"]["dualpath"];
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(30)), d.logs());
  // Every engine node runs its KV work below its control traffic (all of
  // these threads run once the node says it joined: its engine answered
  // before it enrolled, spawn_node_engine): the
  // storage readers' I/O threads, the GPU streams' copy threads and the tcp
  // kv threads at SCHED_IDLE (the CAF threads that carry the control
  // messages are not).
  for (size_t i = 1; i < 4; ++i) {
    auto classes = thread_classes(d.node(i).pid());
    for (std::string kv : {"dp-kv-io", "dp-kv-gpu", "dp-tcp-tx-kv"}) {
      CAPTURE(i);
      CAPTURE(kv);
      CHECK(classes[kv].first > 0);
      CHECK(classes[kv].second == 0);
    }
    CHECK(classes["caf.multiplexer"].first == 0);
    CHECK(classes["caf.multiplexer"].second > 0);
  }
  auto res = run_process(with(
      {dualpath_binary(), "run", "--quiet", "--json", "--cluster", cluster},
      settings));
  REQUIRE_MESSAGE(res.status == 0, (res.err + d.logs()));
  auto doc = parse_report(res.out);
  REQUIRE(doc["modes"].contains("dualpath"));
  auto got = doc["modes"]["dualpath"];
  CHECK(got["requests"] == emb["requests"]);
  CHECK(got["requests"].get<int>() == 12);
  CHECK(got["failed_requests"] == 0);
  CHECK(got["verify_failures"] == 0);
  CHECK(got["blocks_verified"].get<uint64_t>() > 0);
  CHECK(got["blocks_verified"] == emb["blocks_verified"]);
  CHECK(got["bytes_read_pe_side"].get<uint64_t>()
            + got["bytes_read_de_side"].get<uint64_t>()
        == emb["bytes_read_pe_side"].get<uint64_t>()
               + emb["bytes_read_de_side"].get<uint64_t>());
  CHECK(got["recomputed_blocks"] == emb["recomputed_blocks"]);
  CHECK(got["reroutes"] == 0);
  // Both read paths were used across processes.
  CHECK(got["bytes_read_de_side"].get<uint64_t>() > 0);
  // TLS: no plaintext warning anywhere.
  CHECK(d.logs().find("WARNING") == std::string::npos);
}
