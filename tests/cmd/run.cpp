// ctest-label: run
// `dualpath run` as a real process on a small emulated cluster: every mode
// completes with every block verified byte-exact; Oracle reads nothing;
// Basic reads nothing on the decode side; DualPath reads on both sides; the
// JSON has the documented keys; bad input exits 2 naming what was wrong;
// gpu.backend decides where the KV lives and says so.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/cmd/small_cluster.hpp"
#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using dualpath::test::temp_dir;
using nlohmann::json;

namespace {

// `dualpath run` on the small cluster (tests/cmd/small_cluster.hpp), six
// agents, 20 times faster than real time, its store in `dir`.
std::vector<std::string> small_run(const temp_dir& dir,
                                   std::vector<std::string> extra) {
  extra.insert(extra.begin(),
               {"--time-scale", "20", "--store-dir", dir.file("store")});
  return dualpath::test::small_cluster("run", "6", extra);
}

json run_json(const temp_dir& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "--json");
  auto res = run_process(small_run(dir, extra));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  return json::parse(res.out);
}

} // namespace

TEST_CASE("every mode completes with every block verified") {
  temp_dir dir;
  auto doc = run_json(dir, {"--mode", "ablation"});
  const char* keys[] = {"jct_s",
                        "tokens_per_s",
                        "ttft_p50_s",
                        "ttft_p99_s",
                        "tpot_p50_s",
                        "tpot_p99_s",
                        "snic_util_pe",
                        "snic_util_de",
                        "snic_max_over_avg",
                        "bytes_read_pe_side",
                        "bytes_read_de_side",
                        "bytes_compute_net",
                        "blocks_verified",
                        "verify_failures",
                        "control_rtt_p50_ms",
                        "control_rtt_p99_ms"};
  REQUIRE(doc.contains("modes"));
  for (auto mode :
       {"basic", "layerwise", "dualpath-rr", "dualpath", "oracle"}) {
    CAPTURE(mode);
    REQUIRE(doc["modes"].contains(mode));
    auto& m = doc["modes"][mode];
    for (auto key : keys) {
      CAPTURE(key);
      CHECK(m.contains(key));
    }
    CHECK(m["requests"].get<int>() == doc["requests_per_mode"].get<int>());
    CHECK(m["failed_requests"].get<int>() == 0);
    CHECK(m["verify_failures"].get<int>() == 0);
    CHECK(m["blocks_verified"].get<int>() > 0);
    CHECK(m["jct_s"].get<double>() > 0);
    // The wall-clock health signal is sampled (a real timer is never
    // exactly on time), not left at its initial 0.
    CHECK(m["lag_p99_ms"].get<double>() > 0);
    // The control round trip (a fetch to the scheduler and its reply) is
    // measured in real time: positive, and a fraction of the job.
    auto rtt_p50 = m["control_rtt_p50_ms"].get<double>();
    auto rtt_p99 = m["control_rtt_p99_ms"].get<double>();
    CHECK(rtt_p50 > 0);
    CHECK(rtt_p50 <= rtt_p99);
    CHECK(rtt_p99 < m["jct_s"].get<double>() * 1e3);
  }
  // Oracle bypasses I/O, not caching: the blocks the other modes persist
  // after decode are stored for it too, so no turn recomputes more.
  CHECK(doc["modes"]["oracle"]["recomputed_blocks"].get<int>()
        == doc["modes"]["basic"]["recomputed_blocks"].get<int>());
  CHECK(doc["modes"]["oracle"]["blocks_persisted"].get<int>()
        == doc["modes"]["basic"]["blocks_persisted"].get<int>());
  // Every mode verifies the same blocks: the whole prompt of every request.
  auto verified = doc["modes"]["basic"]["blocks_verified"].get<int>();
  for (auto mode : {"layerwise", "dualpath-rr", "dualpath", "oracle"})
    CHECK(doc["modes"][mode]["blocks_verified"].get<int>() == verified);
  // Oracle moves no byte; Basic and layerwise never read on the decode side;
  // DualPath reads on both sides.
  auto& oracle = doc["modes"]["oracle"];
  CHECK(oracle["bytes_read_pe_side"].get<uint64_t>() == 0);
  CHECK(oracle["bytes_read_de_side"].get<uint64_t>() == 0);
  CHECK(oracle["bytes_compute_net"].get<uint64_t>() == 0);
  for (auto mode : {"basic", "layerwise"}) {
    CHECK(doc["modes"][mode]["bytes_read_de_side"].get<uint64_t>() == 0);
    CHECK(doc["modes"][mode]["bytes_read_pe_side"].get<uint64_t>() > 0);
  }
  auto& dual = doc["modes"]["dualpath"];
  CHECK(dual["bytes_read_pe_side"].get<uint64_t>()
            + dual["bytes_read_de_side"].get<uint64_t>()
        == doc["modes"]["basic"]["bytes_read_pe_side"].get<uint64_t>());
  // (That the scheduler balances the storage NICs better than round robin
  // is a policy property, checked where it is deterministic: tests/cmd/sim.cpp.
  // In this small real-time run both are within 1% of 1.0 and their order
  // follows the host's timing.)
  REQUIRE(doc.contains("ratios"));
  CHECK(doc["ratios"].contains("basic_over_dualpath_jct"));
  CHECK(doc["ratios"].contains("dualpath_over_oracle_jct"));
  CHECK(doc["ratios"]["basic_over_dualpath_jct"].get<double>() > 0);
  CHECK(doc.contains("wall_s"));
}

TEST_CASE("one GPU per node: the lone engines still fetch and report") {
  temp_dir dir;
  auto doc =
      run_json(dir, {"--mode", "dualpath", "--set", "hardware.gpus_per_node=1",
                     "--set", "model.total_params=37e9", "--turns", "1"});
  auto& m = doc["modes"]["dualpath"];
  CHECK(m["failed_requests"].get<int>() == 0);
  CHECK(m["requests"].get<int>() == doc["requests_per_mode"].get<int>());
  CHECK(m["verify_failures"].get<int>() == 0);
}

TEST_CASE("the human report names every mode and the ratios") {
  temp_dir dir;
  auto res = run_process(small_run(dir, {"--mode", "basic,dualpath"}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  CHECK(res.out.find("basic") != std::string::npos);
  CHECK(res.out.find("dualpath") != std::string::npos);
  CHECK(res.out.find("Basic / DualPath JCT") != std::string::npos);
  CHECK(res.out.find("blocks verified") != std::string::npos);
  CHECK(res.out.find("byte scale 656") != std::string::npos);
  // How far each mode is from its bound, beside its JCT.
  CHECK(res.out.find("agents done p50/p90 (s)") != std::string::npos);
  CHECK(res.out.find("JCT / bound") != std::string::npos);
  CHECK(res.out.find("bounds (fluid") != std::string::npos);
  CHECK(res.out.find("prefill compute") != std::string::npos);
  CHECK(res.out.find("PE storage NICs") != std::string::npos);
  CHECK(res.out.find("all storage NICs") != std::string::npos);
}

TEST_CASE("whole trajectories (--turns 0): every turn verified byte-exact") {
  temp_dir dir;
  dualpath::test::write_file(
      dir.file("trace.jsonl"),
      "{\"agent\": 0, \"turns\": [{\"append\": 700, \"gen\": 100}, "
      "{\"append\": 200, \"gen\": 50}, {\"append\": 90, \"gen\": 10}]}\n"
      "{\"agent\": 1, \"turns\": [{\"append\": 500, \"gen\": 20}, "
      "{\"append\": 30, \"gen\": 30}]}\n");
  auto doc = run_json(dir, {"--mode", "basic,dualpath", "--turns", "0",
                            "--trace-file", dir.file("trace.jsonl")});
  CHECK(doc["requests_per_mode"].get<int>() == 5);
  for (auto mode : {"basic", "dualpath"}) {
    CAPTURE(mode);
    auto& m = doc["modes"][mode];
    CHECK(m["requests"].get<int>() == 5);
    CHECK(m["failed_requests"].get<int>() == 0);
    CHECK(m["verify_failures"].get<int>() == 0);
    // Every block of every prompt's KV (hit or computed) is checked at its
    // decode engine: ceil(prompt / 64) = 11 + 16 + 18 + 8 + 9.
    CHECK(m["blocks_verified"].get<int>() == 62);
  }
  // Only what earlier turns persisted can hit: 768 + 1,024 + 512 tokens, all
  // of them read (ds-660b: 656 B x 61 layers per token).
  CHECK(doc["bounds"]["hit_tokens"].get<int>() == 2304);
  CHECK(doc["modes"]["basic"]["bytes_read_pe_side"].get<uint64_t>()
        == 2304ull * 656 * 61);
}

TEST_CASE("bad input exits 2 naming what was wrong") {
  temp_dir dir;
  auto bad_mode = run_process(small_run(dir, {"--mode", "turbo"}));
  CHECK(bad_mode.status == 2);
  CHECK(bad_mode.err.find("turbo") != std::string::npos);
  auto bad_sweep = run_process(small_run(dir, {"--aps-sweep", "1,x"}));
  CHECK(bad_sweep.status == 2);
  CHECK(bad_sweep.err.find("'x'") != std::string::npos);
  auto negative_turns = run_process(small_run(dir, {"--turns", "-1"}));
  CHECK(negative_turns.status == 2);
  CHECK(negative_turns.err.find("run.turns") != std::string::npos);
  dualpath::test::write_file(dir.file("bad.jsonl"),
                             "{\"agent\": 1, \"turns\": [{\"append\": 0, "
                             "\"gen\": 3}]}\n");
  auto bad_trace =
      run_process(small_run(dir, {"--trace-file", dir.file("bad.jsonl")}));
  CHECK(bad_trace.status == 2);
  CHECK(bad_trace.err.find("line 1") != std::string::npos);
  CHECK(bad_trace.err.find("append") != std::string::npos);
}

TEST_CASE("gpu.backend: auto says where the KV lives once; cuda needs a GPU") {
  temp_dir dir;
  // auto: the choice is stated once on stderr and in the JSON; without a
  // CUDA device host memory stands in for HBM.
  auto res =
      run_process(small_run(dir, {"--json", "--mode", "dualpath", "--turns",
                                  "1", "--set", "gpu.backend=auto"}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  auto doc = json::parse(res.out);
  REQUIRE(doc.contains("gpu"));
  auto backend = doc["gpu"]["backend"].get<std::string>();
  auto reason = doc["gpu"]["reason"].get<std::string>();
  MESSAGE(reason);
  CHECK(reason.rfind("gpu.backend=auto: ", 0) == 0);
  auto line = "dualpath run: " + reason;
  auto first = res.err.find(line);
  REQUIRE(first != std::string::npos);
  CHECK(res.err.find(line, first + 1) == std::string::npos); // once
  auto& m = doc["modes"]["dualpath"];
  CHECK(m["verify_failures"].get<int>() == 0);
  CHECK(m["blocks_verified"].get<int>() > 0);
  // cuda: with a device the same run verifies every block in GPU memory;
  // without one it is bad input naming the key and the missing device.
  auto forced =
      run_process(small_run(dir, {"--json", "--mode", "dualpath", "--turns",
                                  "1", "--set", "gpu.backend=cuda"}));
  if (backend == "cuda") {
    REQUIRE_MESSAGE(forced.status == 0, forced.err);
    auto fdoc = json::parse(forced.out);
    CHECK(fdoc["gpu"]["backend"].get<std::string>() == "cuda");
    CHECK(fdoc["modes"]["dualpath"]["verify_failures"].get<int>() == 0);
    CHECK(fdoc["modes"]["dualpath"]["blocks_verified"].get<int>() > 0);
    CHECK(forced.err.find("engine rank -> CUDA device") != std::string::npos);
  } else {
    CHECK(backend == "host");
    CHECK(reason.find("host memory stands in for HBM, because")
          != std::string::npos);
    CHECK(forced.status == 2);
    CHECK(forced.err.find("gpu.backend = cuda") != std::string::npos);
    CHECK(forced.err.find("no CUDA device") != std::string::npos);
    CHECK(forced.out.empty());
  }
  // host: as configured, whatever the machine has.
  auto host = run_process(
      small_run(dir, {"--json", "--mode", "dualpath", "--turns", "1", "--set",
                      "gpu.backend=host", "--set", "gpu.device=5"}));
  REQUIRE_MESSAGE(host.status == 0, host.err);
  auto hdoc = json::parse(host.out);
  CHECK(hdoc["gpu"]["backend"].get<std::string>() == "host");
  CHECK(hdoc["gpu"]["reason"].get<std::string>().find("as configured")
        != std::string::npos);
  auto bad = run_process(small_run(dir, {"--set", "gpu.backend=tpu"}));
  CHECK(bad.status == 2);
  CHECK(bad.err.find("gpu.backend") != std::string::npos);
}

TEST_CASE("CAF's own options reach the run's actor system") {
  // CAF's profiler writes one line per worker thread and sample: the worker
  // ids show how many threads the scheduler ran.
  temp_dir dir;
  auto workers = [&](std::vector<std::string> extra) {
    auto prof = dir.file("profile.txt");
    std::remove(prof.c_str());
    extra.insert(extra.end(), {"--mode", "basic", "--set", "caf.profiling=true",
                               "--set", "caf.profiling_file=" + prof});
    auto res = run_process(small_run(dir, extra));
    REQUIRE_MESSAGE(res.status == 0, res.err);
    std::ifstream in{prof};
    std::set<int> ids;
    std::string clock, type;
    int id = 0;
    std::string rest;
    std::getline(in, rest); // the column names
    while (in >> clock >> type >> id && std::getline(in, rest))
      if (type == "worker")
        ids.insert(id);
    return ids.size();
  };
  auto ini = dir.file("caf.ini");
  dualpath::test::write_file(ini, "[scheduler]\nmax-threads=5\n");
  CHECK(workers({"--scheduler.max-threads=3"}) == 3);
  CHECK(workers({"--config-file=" + ini}) == 5);
  // The command line over the file, as CAF orders them.
  CHECK(workers({"--config-file=" + ini, "--scheduler.max-threads=2"}) == 2);
  auto bad = run_process(small_run(dir, {"--scheduler.max-threads=0"}));
  CHECK(bad.status == 2);
  CHECK(bad.err.find("'scheduler.max-threads' = 0") != std::string::npos);
}

TEST_CASE("run's defaults are the main job: a storage-bound 1/8 slice") {
  // The effective configuration of a bare `dualpath run`, replayed by the
  // deterministic simulation (the limit of run with an infinitely fast
  // host): the regime the default shows, without 50 s of real time here.
  temp_dir dir;
  auto cfg = run_process({dualpath_binary(), "run", "--print-config"});
  REQUIRE(cfg.status == 0);
  CHECK(cfg.out.find("profile = \"paper-hopper-slice8\"  # default of "
                     "dualpath run")
        != std::string::npos);
  CHECK(cfg.out.find("slice = 8  # profile paper-hopper-slice8")
        != std::string::npos);
  auto file = dir.file("main-job.toml");
  std::ofstream{file} << cfg.out;
  auto sim = run_process(
      {dualpath_binary(), "sim", "--quiet", "--json", "--config", file});
  REQUIRE_MESSAGE(sim.status == 0, sim.err);
  auto doc = json::parse(sim.out);
  auto basic = doc["modes"]["basic"];
  auto dual = doc["modes"]["dualpath"];
  // Basic is bound by the prefill side's storage NICs, DualPath reads on
  // both sides and finishes at least 1.5x sooner.
  CHECK(basic["bound"] == "pe_snic");
  CHECK(basic["snic_util_pe"].get<double>() > 0.8);
  CHECK(dual["snic_util_de"].get<double>() > 0.3);
  CHECK(doc["ratios"]["basic_over_dualpath_jct"].get<double>() >= 1.5);
  // The header says what is scaled; flags still override the defaults.
  auto text = run_process({dualpath_binary(), "sim", "--quiet", "--config",
                           file, "--mode", "dualpath"});
  CHECK(text.out.find("scaled: a 1/8 slice of a cluster of 8-GPU nodes")
        != std::string::npos);
  auto help = run_process({dualpath_binary(), "run", "--help"});
  CHECK(help.out.find("(default 96 in dualpath run; the schema's 16)")
        != std::string::npos);
  auto driven = run_process(
      {dualpath_binary(), "run", "--print-config", "--agents", "5"});
  CHECK(driven.out.find("agents = 5  # --agents") != std::string::npos);
  // Bad slices are refused before any work, naming the key.
  auto zero = run_process(
      {dualpath_binary(), "run", "--quiet", "--set", "hardware.slice=0"});
  CHECK(zero.status == 2);
  CHECK(zero.err.find("hardware.slice") != std::string::npos);
  // DS-660B's weights do not fit a one-GPU slice node at 1P2D x 8.
  auto big =
      run_process({dualpath_binary(), "run", "--quiet", "--model", "ds-660b"});
  CHECK(big.status == 2);
  CHECK(big.err.find("hardware.slice") != std::string::npos);
}
