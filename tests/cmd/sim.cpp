// ctest-label: sim
// ctest-serial: `dualpath run` in real time, compared with sim on JCT
//
// `dualpath sim` as a real process: the same seed gives the same report (every
// key but the wall-clock ones); a small cluster simulated agrees with
// `dualpath run` (real time, real bytes) on JCT within 10% for the same trace
// and hardware; the report is run's plus the simulation's cost, and says that
// no KV was verified; bad input exits 2.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "scheduler/workload/generator.hpp"
#include "tests/cmd/small_cluster.hpp"
#include "tests/sanitizers.hpp"
#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using dualpath::test::temp_dir;
using nlohmann::json;

namespace {

// `command` (run or sim) on the small cluster (tests/cmd/small_cluster.hpp),
// six agents, JSON on stdout.
std::vector<std::string> small(const std::string& command,
                               std::vector<std::string> extra) {
  extra.insert(extra.begin(), "--json");
  return dualpath::test::small_cluster(command, "6", extra);
}

json run_json(std::vector<std::string> args) {
  auto res = run_process(args);
  REQUIRE_MESSAGE(res.status == 0, res.err);
  return json::parse(res.out);
}

// Removes every key whose value depends on the wall clock.
void strip_wall(json& doc) {
  static const char* keys[] = {
      "wall_s",          "populate_s",      "setup_s",
      "lag_p99_ms",      "events_per_s",    "sim_events_per_s",
      "scheduler_cpu_s", "scheduler_cores", "scheduler_wall_s"};
  if (doc.is_object()) {
    for (auto key : keys)
      doc.erase(key);
    for (auto& [k, v] : doc.items())
      strip_wall(v);
  } else if (doc.is_array()) {
    for (auto& v : doc)
      strip_wall(v);
  }
}

} // namespace

TEST_CASE("the same seed gives the same report") {
  auto args = small("sim", {"--mode", "basic,dualpath"});
  auto a = run_json(args);
  auto b = run_json(args);
  strip_wall(a);
  strip_wall(b);
  CHECK(a.dump(1) == b.dump(1));
  // Another seed is another trace, hence another report.
  auto other =
      small("sim", {"--mode", "basic,dualpath", "--set", "workload.seed=7"});
  auto c = run_json(other);
  strip_wall(c);
  CHECK(a.dump() != c.dump());
}

TEST_CASE("the report is run's plus the simulation's cost") {
  auto doc = run_json(small("sim", {"--mode", "ablation"}));
  REQUIRE(doc.contains("modes"));
  CHECK(doc["data_plane"] == "modeled");
  CHECK(doc["verification"] == "not verified: simulated data plane");
  CHECK(doc["sim_events"].get<uint64_t>() > 0);
  CHECK(doc["sim_events_per_s"].get<double>() > 0);
  CHECK(doc.contains("wall_s"));
  CHECK(doc["ratios"]["basic_over_dualpath_jct"].get<double>() > 1.0);
  for (auto mode :
       {"basic", "layerwise", "dualpath-rr", "dualpath", "oracle"}) {
    CAPTURE(mode);
    REQUIRE(doc["modes"].contains(mode));
    auto& m = doc["modes"][mode];
    CHECK(m["requests"].get<int>() == doc["requests_per_mode"].get<int>());
    CHECK(m["failed_requests"].get<int>() == 0);
    CHECK(m["jct_s"].get<double>() > 0);
    // Agents finish over time; the last one is the JCT.
    CHECK(m["agents_done_p50_s"].get<double>() > 0);
    CHECK(m["agents_done_p50_s"].get<double>()
          <= m["agents_done_p90_s"].get<double>());
    CHECK(m["agents_done_p90_s"].get<double>() <= m["jct_s"].get<double>());
    // Honest verification counts: nothing is verified, nothing failed.
    CHECK(m["blocks_verified"].get<int>() == 0);
    CHECK(m["verify_failures"].get<int>() == 0);
    CHECK(m["recomputed_blocks"].get<int>() == 0);
    REQUIRE(m.contains("sim"));
    CHECK(m["sim"]["events"].get<uint64_t>() > 0);
    CHECK(m["sim"].contains("scheduler_cores"));
    CHECK(m["sim"]["scheduler_wall_s"].get<double>() > 0);
    // Where the events went: by actor, adding up to all of them.
    uint64_t by_actor = 0;
    for (auto& [actor, n] : m["sim"]["events_by_actor"].items())
      by_actor += n.get<uint64_t>();
    CHECK(by_actor == m["sim"]["events"].get<uint64_t>());
    CHECK(m["sim"]["events_by_actor"]["dualpath.scheduler"].get<uint64_t>()
          > 0);
  }
  auto& oracle = doc["modes"]["oracle"];
  CHECK(oracle["bytes_read_pe_side"].get<uint64_t>() == 0);
  CHECK(oracle["bytes_read_de_side"].get<uint64_t>() == 0);
  for (auto mode : {"basic", "layerwise"})
    CHECK(doc["modes"][mode]["bytes_read_de_side"].get<uint64_t>() == 0);
  auto& dual = doc["modes"]["dualpath"];
  CHECK(dual["bytes_read_pe_side"].get<uint64_t>()
            + dual["bytes_read_de_side"].get<uint64_t>()
        == doc["modes"]["basic"]["bytes_read_pe_side"].get<uint64_t>());
}

TEST_CASE("--turns 0 submits every turn of every trajectory") {
  // The workload.* defaults are trace-64k's preset; six agents as small().
  auto p = dualpath::scheduler::workload::preset("trace-64k");
  REQUIRE(p);
  p->agents = 6;
  auto trace = dualpath::scheduler::workload::generate(*p);
  REQUIRE(trace);
  uint64_t turns = 0;
  for (auto& t : *trace)
    turns += t.turns.size();
  auto doc = run_json(
      small("sim", {"--mode", "basic,dualpath,oracle", "--turns", "0"}));
  CHECK(doc["requests_per_mode"].get<uint64_t>() == turns);
  // Nothing is in storage when the first turns arrive.
  CHECK(doc["mean_hit_share"].get<double>() == 0);
  auto& b = doc["bounds"];
  auto hit_bytes = b["hit_bytes"].get<uint64_t>();
  CHECK(hit_bytes > 0);
  for (auto mode : {"basic", "dualpath", "oracle"}) {
    CAPTURE(mode);
    auto& m = doc["modes"][mode];
    CHECK(m["requests"].get<uint64_t>() == turns);
    CHECK(m["failed_requests"].get<int>() == 0);
    // A fluid bound is a lower bound: no mode beats it.
    CHECK(m["bound_s"].get<double>() > 0);
    CHECK(m["jct_over_bound"].get<double>() >= 1.0);
    CHECK(m["jct_over_bound"].get<double>()
          == doctest::Approx(m["jct_s"].get<double>()
                             / m["bound_s"].get<double>()));
  }
  // Each mode is held to the larger of compute and the paths it reads on.
  auto compute = b["prefill_compute_s"].get<double>();
  CHECK(doc["modes"]["basic"]["bound_s"].get<double>()
        == doctest::Approx(std::max(compute, b["pe_snic_s"].get<double>())));
  CHECK(doc["modes"]["dualpath"]["bound_s"].get<double>()
        == doctest::Approx(std::max(compute, b["all_snic_s"].get<double>())));
  CHECK(doc["modes"]["oracle"]["bound"] == "prefill_compute");
  // The bounds' hit rule is what the store gave: every hit byte was read.
  auto& basic = doc["modes"]["basic"];
  auto& dual = doc["modes"]["dualpath"];
  CHECK(basic["bytes_read_pe_side"].get<uint64_t>() == hit_bytes);
  CHECK(dual["bytes_read_pe_side"].get<uint64_t>()
            + dual["bytes_read_de_side"].get<uint64_t>()
        == hit_bytes);
  // One 400 Gb/s storage NIC per node: 5e10 B/s on the PE side, 1e11 in all.
  CHECK(b["pe_snic_s"].get<double>()
        == doctest::Approx(static_cast<double>(hit_bytes) / 5e10));
  CHECK(b["all_snic_s"].get<double>()
        == doctest::Approx(static_cast<double>(hit_bytes) / 1e11));
  CHECK(b["prefill_compute_s"].get<double>() > 0);
}

TEST_CASE("a DRAM buffer too small for the load: reads wait, none fails") {
  // 5 GiB holds 2,096 Full Blocks of this model: the decode node's reads may
  // hold 1,070 of them (the rest is the longest prompt's headroom), less than
  // six agents' turns in flight ask for. Nothing fails or is recomputed for
  // a full buffer: the reads and reservations wait for releases, and every
  // turn still completes with every block persisted.
  auto at = [](const char* gib) {
    return run_json(
        small("sim", {"--mode", "basic,dualpath", "--turns", "0", "--set",
                      std::string("hardware.dram_buffer_gib=") + gib}));
  };
  auto tight = at("5");
  auto roomy = at("80");
  CHECK(tight["requests_per_mode"] == roomy["requests_per_mode"]);
  for (auto mode : {"basic", "dualpath"}) {
    CAPTURE(mode);
    auto& t = tight["modes"][mode];
    auto& r = roomy["modes"][mode];
    CHECK(t["requests"] == r["requests"]);
    CHECK(t["failed_requests"].get<int>() == 0);
    CHECK(t["recomputed_blocks"] == r["recomputed_blocks"]);
    CHECK(t["blocks_persisted"] == r["blocks_persisted"]);
    CHECK(t["buffer_waits"].get<uint64_t>() > 0);
    CHECK(r["buffer_waits"].get<uint64_t>() == 0);
    // Waiting buys no time. Not strictly monotone: fewer reads in flight
    // share the decode node's DRAM with fewer copies, so the order of
    // completions moves a little (since the layer-by-layer copy into GPU
    // memory, 5f78079, the tight runs end 0.1-0.4% sooner; before, later).
    CHECK(t["jct_s"].get<double>() >= 0.99 * r["jct_s"].get<double>());
  }
  // Both sides read: the decode side's reads are the ones that waited most.
  CHECK(tight["modes"]["dualpath"]["bytes_read_de_side"].get<uint64_t>() > 0);
}

TEST_CASE("the scheduler balances the storage NICs better than round robin") {
  // Whole trajectories on the small cluster: round robin with the
  // shorter-queue path choice leaves one storage NIC far busier than the
  // other; the scheduler's split reads keep them level (brief: Max/Avg 1.53
  // -> 1.18 in the paper).
  auto doc = run_json(
      small("sim", {"--mode", "dualpath-rr,dualpath", "--turns", "0"}));
  auto rr = doc["modes"]["dualpath-rr"]["snic_max_over_avg"].get<double>();
  auto sched = doc["modes"]["dualpath"]["snic_max_over_avg"].get<double>();
  CAPTURE(rr);
  CAPTURE(sched);
  CHECK(sched >= 1.0);
  CHECK(sched < 1.1);
  CHECK(rr > 1.3 * sched);
}

TEST_CASE("--turns 0 honours a trace file's own history turns") {
  temp_dir dir;
  // Agent 0: three turns, nothing in storage. Agent 1: four turns, the first
  // two history (in storage by the file's statement).
  dualpath::test::write_file(
      dir.file("trace.jsonl"),
      "{\"agent\": 0, \"turns\": [{\"append\": 700, \"gen\": 100}, "
      "{\"append\": 200, \"gen\": 50}, {\"append\": 90, \"gen\": 10}]}\n"
      "{\"agent\": 1, \"turns\": [{\"append\": 500, \"gen\": 20}, "
      "{\"append\": 30, \"gen\": 30}, {\"append\": 100, \"gen\": 5}, "
      "{\"append\": 64, \"gen\": 1}], \"history\": 2}\n");
  auto doc = run_json(small("sim", {"--mode", "basic,dualpath", "--turns", "0",
                                    "--trace-file", dir.file("trace.jsonl")}));
  // 3 + (4 - 2) requests.
  CHECK(doc["requests_per_mode"].get<int>() == 5);
  for (auto mode : {"basic", "dualpath"})
    CHECK(doc["modes"][mode]["requests"].get<int>() == 5);
  // Hits in 64-token blocks of the context before each append: agent 0
  // 0 + 768 (of 800) + 1,024 (of 1,050); agent 1 576 (of its 580-token
  // history) + 640 (of 685): 3,008 tokens x 656 B x 61 layers.
  const uint64_t hit_bytes = 3008ull * 656 * 61;
  CHECK(doc["bounds"]["hit_tokens"].get<uint64_t>() == 3008);
  CHECK(doc["bounds"]["hit_bytes"].get<uint64_t>() == hit_bytes);
  CHECK(doc["modes"]["basic"]["bytes_read_pe_side"].get<uint64_t>()
        == hit_bytes);
}

#if defined(DUALPATH_TEST_ASAN) || defined(DUALPATH_TEST_TSAN)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

TEST_CASE("a small cluster simulated agrees with run on JCT within 10%") {
  temp_dir dir;
  // run in real time (time scale 1): the emulation keeps up best there.
  auto real = run_json(small("run", {"--mode", "basic,dualpath", "--time-scale",
                                     "1", "--store-dir", dir.file("store")}));
  auto simulated = run_json(small("sim", {"--mode", "basic,dualpath"}));
  for (auto mode : {"basic", "dualpath"}) {
    CAPTURE(mode);
    auto r = real["modes"][mode]["jct_s"].get<double>();
    auto s = simulated["modes"][mode]["jct_s"].get<double>();
    CAPTURE(r);
    CAPTURE(s);
    // The emulation agrees with the simulation only while the CPUs keep up
    // with real time: not under a sanitizer (several times slower), and not
    // when the run's own health signal says its timers fired late.
    auto lag = real["modes"][mode]["lag_p99_ms"].get<double>();
    // ctest runs this suite alone (the ctest-serial line above): in CI
    // (2026-12-04) a run beside cmd.run and gpu.host_device came out 11%
    // away from the simulation with its lag p99 under 10 ms.
    // 10 ms: the lag a healthy run keeps (issue 20's limit for the main
    // job); a late run is still never faster than the simulation, its limit.
    if (sanitized || lag > 10) {
      MESSAGE("JCT comparison skipped: "
              << (sanitized ? "sanitizer build"
                            : "the run's timers fired late (lag p99 "
                                  + std::to_string(lag) + " ms)"));
      CHECK(s <= 1.02 * r);
    } else {
      CHECK(std::abs(s - r) <= 0.10 * r);
    }
    // The same blocks are read (where depends on timing in dualpath).
    auto bytes = [&](json& doc) {
      return doc["modes"][mode]["bytes_read_pe_side"].get<uint64_t>()
             + doc["modes"][mode]["bytes_read_de_side"].get<uint64_t>();
    };
    CHECK(bytes(real) == bytes(simulated));
  }
}

TEST_CASE("coarser layer steps: far fewer prefill jobs, nearly the same JCT") {
  auto fine = run_json(small("sim", {"--mode", "basic,dualpath"}));
  auto coarse = run_json(small(
      "sim", {"--mode", "basic,dualpath", "--set", "sim.layers_per_step=8"}));
  for (auto mode : {"basic", "dualpath"}) {
    CAPTURE(mode);
    auto& f = fine["modes"][mode];
    auto& c = coarse["modes"][mode];
    // The prefill node's actors: its engine and the layer streamer that
    // runs its steps' layers.
    auto jobs = [](json& m) {
      auto& by = m["sim"]["events_by_actor"];
      return by["prefill_engine"].get<double>()
             + by["layer_streamer"].get<double>();
    };
    // 61 layers -> 8 steps: the per-layer protocol runs ~1/8 as often (the
    // engines' 10 ms fetch and report ticks stay: at 6 agents they are most
    // of what is left).
    CHECK(jobs(c) < jobs(f) * 3 / 4);
    CHECK(c["sim"]["events"].get<double>() < f["sim"]["events"].get<double>());
    // The same work: bytes read, requests, and JCT within 5%.
    for (auto key : {"bytes_read_pe_side", "bytes_read_de_side", "requests"})
      CHECK(c[key] == f[key]);
    auto jf = f["jct_s"].get<double>();
    auto jc = c["jct_s"].get<double>();
    CAPTURE(jf);
    CAPTURE(jc);
    CHECK(std::abs(jc - jf) <= 0.05 * jf);
    CHECK(jc != jf); // the knob does change the simulation
  }
}

TEST_CASE("bad input exits 2 naming what was wrong") {
  auto bad_mode = run_process(small("sim", {"--mode", "turbo"}));
  CHECK(bad_mode.status == 2);
  CHECK(bad_mode.err.find("turbo") != std::string::npos);
  auto negative_turns = run_process(small("sim", {"--turns", "-1"}));
  CHECK(negative_turns.status == 2);
  CHECK(negative_turns.err.find("run.turns") != std::string::npos);
  // Coarse steps are a simulation's knob: run moves and verifies every layer.
  temp_dir dir;
  auto coarse_run =
      run_process(small("run", {"--set", "sim.layers_per_step=2", "--store-dir",
                                dir.file("store")}));
  CHECK(coarse_run.status == 2);
  CHECK(coarse_run.err.find("sim.layers_per_step") != std::string::npos);
  auto zero_step =
      run_process(small("sim", {"--set", "sim.layers_per_step=0"}));
  CHECK(zero_step.status == 2);
  CHECK(zero_step.err.find("sim.layers_per_step") != std::string::npos);
}
