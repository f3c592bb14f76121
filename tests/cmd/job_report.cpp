// ctest-label: sim
// What `dualpath sim` and `dualpath run` print around a job, as real
// processes: the first lines say what is compared on what, a verdict in
// words, --aps states its rate, a sweep's tables are labelled and a capacity
// at the top of the sweep is flagged as a lower bound, absent modes give null
// ratios, `--json FILE` behaves alike for both commands; what would fail only
// after the whole job (unwritable output paths, contradicting options) exits
// 2 first, naming the path or the options; typos get a "did you mean".
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using dualpath::test::temp_dir;
using nlohmann::json;

namespace {

dualpath::test::process_result dp(std::vector<std::string> args) {
  args.insert(args.begin(), dualpath_binary());
  return run_process(args);
}

// A small simulated job (milliseconds of wall time).
std::vector<std::string> sim(std::vector<std::string> extra) {
  std::vector<std::string> args{"sim", "--quiet", "--agents",
                                "32",  "--turns", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string slurp(const std::string& path) {
  std::ifstream in{path};
  return {std::istreambuf_iterator<char>{in}, {}};
}

} // namespace

TEST_CASE("the report says what is compared on what, and a verdict") {
  auto res = dp(sim({}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  CHECK(res.out.rfind("dualpath sim: compares basic, dualpath and oracle on "
                      "the same trace and cluster\n  trace: 32 agents, 64 "
                      "requests per mode",
                      0)
        == 0);
  CHECK(has(res.out, "offline: every agent starts at t = 0"));
  CHECK(has(res.out, "  cluster: DeepSeek-V3.2 660B on an embedded emulated "
                     "cluster of 2P4D x 8 GPUs (paper-hopper hardware)\n"));
  CHECK(has(res.out, "simulated time, modeled data plane"));
  auto at = res.out.find("\nverdict: DualPath ");
  REQUIRE(at != std::string::npos);
  auto line = res.out.substr(at + 1, res.out.find('\n', at + 1) - at - 1);
  CAPTURE(line);
  CHECK((has(line, "x faster than Basic") || has(line, "as long as Basic")
         || has(line, "same time")));
  CHECK(has(line, "Oracle's zero-I/O JCT"));
  CHECK(has(line, "Storage NICs busy"));
  CHECK(has(line, "basic "));
  CHECK(has(line, "dualpath "));
  CHECK(has(line, "% / "));
  // No reroutes row: an embedded cluster loses no node.
  CHECK(!has(res.out, "rerouted requests"));
}

TEST_CASE("--aps states the rate; a sweep is labelled, its top flagged") {
  auto online = dp(sim({"--aps", "2.5", "--mode", "dualpath"}));
  REQUIRE_MESSAGE(online.status == 0, online.err);
  CHECK(has(online.out, "online: agents arrive at 2.5 agents per emulated "
                        "second (Poisson)"));
  auto sweep =
      dp(sim({"--aps-sweep", "0.5,1000", "--mode", "dualpath", "--json", "-"}));
  REQUIRE_MESSAGE(sweep.status == 0, sweep.err);
  auto doc = json::parse(sweep.out);
  auto cap = doc["capacity_aps"]["dualpath"].get<double>();
  auto lower = doc["capacity_is_lower_bound"]["dualpath"].get<bool>();
  CHECK(lower == (cap == 1000));
  auto text = dp(sim({"--aps-sweep", "0.5,1", "--mode", "dualpath"}));
  REQUIRE_MESSAGE(text.status == 0, text.err);
  CHECK(has(text.out, "offline: every agent starts at t = 0"));
  CHECK(has(text.out, "\nonline replay at 0.5 agents per emulated second "
                      "(Poisson arrivals):\n"));
  CHECK(has(text.out, "\nonline replay at 1 agents per emulated second"));
  // 32 agents at one per second meet the SLO: the capacity is at least the
  // top of the sweep, and says so.
  CHECK(has(text.out, "  dualpath: >= 1 APS (a lower bound"));
  auto both = dp(sim({"--aps", "3", "--aps-sweep", "1,2"}));
  CHECK(both.status == 2);
  CHECK(both.out.empty());
  CHECK(has(both.err, "--aps-sweep 1,2"));
  CHECK(has(both.err, "run.aps = 3.0 (--aps)"));
}

TEST_CASE("absent modes give null ratios") {
  auto res = dp(sim({"--mode", "dualpath", "--json"}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  auto doc = json::parse(res.out);
  CHECK(doc["ratios"]["basic_over_dualpath_jct"].is_null());
  CHECK(doc["ratios"]["dualpath_over_oracle_jct"].is_null());
  auto pair = json::parse(dp(sim({"--mode", "dualpath,oracle", "--json"})).out);
  CHECK(pair["ratios"]["basic_over_dualpath_jct"].is_null());
  CHECK(pair["ratios"]["dualpath_over_oracle_jct"].get<double>() > 0);
}

TEST_CASE("--json FILE: the JSON goes to the file, the report to stdout") {
  temp_dir dir;
  auto file = dir.file("sim.json");
  auto res = dp(sim({"--json", file}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  CHECK(has(res.out, "dualpath sim: compares"));
  CHECK(has(res.out, "verdict: "));
  auto doc = json::parse(slurp(file));
  CHECK(doc["modes"].contains("dualpath"));
  auto to_stdout = dp(sim({"--json"}));
  REQUIRE(to_stdout.status == 0);
  CHECK(json::parse(to_stdout.out).contains("modes"));
}

TEST_CASE("output paths are checked before any work, naming the path") {
  temp_dir dir;
  auto plain = dir.file("plain");
  dualpath::test::write_file(plain, "keep me");
  struct bad {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<bad> cases = {
      {{"--json", dir.file("no/such/dir/x.json")},
       "--json: cannot write '" + dir.file("no/such/dir/x.json")
           + "': directory '" + dir.file("no/such/dir") + "' does not exist"},
      {{"--json", dir.path()}, "it is a directory"},
      {{"--json", plain + "/x.json"}, "is not a directory"},
      {{"--trace", dir.file("none/t.json")},
       "--trace: cannot write '" + dir.file("none/t.json") + "'"},
      {{"--plot-dir", plain}, "--plot-dir: cannot write '" + plain + "'"},
  };
  for (auto cmd : {"sim", "run"}) {
    for (auto& c : cases) {
      std::vector<std::string> args{cmd, "--quiet"};
      args.insert(args.end(), c.args.begin(), c.args.end());
      auto res = dp(args);
      CAPTURE(cmd);
      CAPTURE(res.err);
      CHECK(res.status == 2);
      CHECK(res.out.empty());
      CHECK(has(res.err, c.message));
      // Before any work: no progress, no store population.
      CHECK(std::count(res.err.begin(), res.err.end(), '\n') == 1);
    }
  }
  // A writable file that exists is not touched by the check.
  CHECK(slurp(plain) == "keep me");
}

TEST_CASE("typos get a suggestion") {
  struct typo {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<typo> cases = {
      {{"runn"}, "dualpath: unknown subcommand 'runn'; did you mean 'run'?"},
      {{"simm", "--agents", "3"}, "did you mean 'sim'?"},
      {{"run", "--agent", "4"},
       "dualpath run: unknown option '--agent'; did you mean '--agents'?"},
      {{"sim", "--plotdir=x"}, "did you mean '--plot-dir'?"},
      {{"sim", "--mode", "dualpth"},
       "unknown mode 'dualpth' (allowed: all, ablation, or a comma list of "
       "basic, layerwise, dualpath-rr, dualpath, oracle); did you mean "
       "'dualpath'?"},
      {{"sim", "--set", "storage.backend=pred"}, "did you mean 'pread'?"},
      {{"frobnicate"}, "unknown subcommand 'frobnicate' (see dualpath --help)"},
  };
  for (auto& c : cases) {
    auto res = dp(c.args);
    CAPTURE(res.err);
    CHECK(res.status == 2);
    CHECK(res.out.empty());
    CHECK(has(res.err, c.message));
    CHECK(std::count(res.err.begin(), res.err.end(), '\n') == 1);
  }
}
