// ctest-label: foundation
// The `dualpath` command line: help, the common options of every subcommand,
// exit status 2 with a single message for bad configuration, --print-config.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "config/settings.hpp"
#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using dualpath::test::temp_dir;
using dualpath::test::write_file;

namespace {

const std::vector<std::string> subcommands = {"plan", "config"};

dualpath::test::process_result run(std::vector<std::string> args) {
  args.insert(args.begin(), dualpath_binary());
  return run_process(args);
}

bool has(const std::string& str, const std::string& part) {
  return str.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("--help lists the subcommands; each has --help") {
  auto res = run({"--help"});
  CHECK(res.status == 0);
  for (auto& name : subcommands) {
    CAPTURE(name);
    CHECK(has(res.out, "\n  " + name + " "));
    auto sub = run({name, "--help"});
    CHECK(sub.status == 0);
    for (auto opt : {"--config", "--set", "--print-config", "--json",
                     "--hardware", "--model", "--workload"})
      CHECK_MESSAGE(has(sub.out, opt), opt);
  }
  auto none = run({});
  CHECK(none.status == 2);
  auto bogus = run({"plan", "--no-such-flag"});
  CHECK(bogus.status == 2);
  CHECK(has(bogus.err, "--no-such-flag"));
}

TEST_CASE("bad configuration exits 2 with one message, on every command") {
  temp_dir dir;
  auto bad_file = dir.file("bad.toml");
  write_file(bad_file, "[storage]\nblock_tokens = 0\n");
  struct bad {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<bad> cases = {
      {{"--set", "storage.block_token=64"},
       "did you mean 'storage.block_tokens'?"},
      {{"--set", "model.layers=many"}, "wrong type"},
      {{"--set", "hardware.snic_gbps=-1"}, "'hardware.snic_gbps' = -1.0"},
      {{"--set", "model.layers=0"}, "'model.layers' = 0"},
      {{"--config", bad_file}, "'storage.block_tokens' = 0"},
      {{"--config", dir.file("missing.toml")}, "does not exist"},
      {{"--config", dir.path()}, "is a directory, not a file"},
      // Opens, then every read fails (EIO), for root too.
      {{"--config", "/proc/self/mem"}, "cannot be read: read: "},
      {{"--config", "/dev/zero"}, "is not a regular file"},
      {{"--scheduler.max-threads=x"},
       "CAF option 'scheduler.max-threads' has the wrong type"},
      {{"--scheduler.policy=fastest"}, "'scheduler.policy' = fastest"},
      {{"--middleman.max-consecutive-read=3"},
       "did you mean 'middleman.max-consecutive-reads'?"},
      {{"--config-file=" + dir.path()}, "CAF config file"},
      {{"--set", "storage.block_tokens=2147483648"},
       "'storage.block_tokens' = 2147483648"},
      {{"--set", "storage.block_tokens=2147483647"},
       "'storage.block_tokens' = 2147483647 (--set) asks for one KV block"},
      {{"--model", "ds-999"}, "unknown model profile 'ds-999'"},
      {{"--set", "storage.backend=spdk"}, "one of auto, io_uring, pread"},
  };
  for (auto& name : subcommands) {
    for (auto& c : cases) {
      auto args = c.args;
      args.insert(args.begin(), name);
      auto res = run(args);
      CAPTURE(name);
      CAPTURE(res.err);
      CHECK(res.status == 2);
      CHECK(res.out.empty());
      CHECK(std::count(res.err.begin(), res.err.end(), '\n') == 1);
      CHECK(has(res.err, c.message));
    }
  }
}

TEST_CASE("--print-config prints the effective configuration and exits 0") {
  for (auto& name : subcommands) {
    auto res = run({name, "--model", "qwen-32b", "--set",
                    "storage.block_tokens=32", "--print-config"});
    CAPTURE(name);
    REQUIRE(res.status == 0);
    auto tbl = toml::parse(res.out);
    CHECK(tbl["model"]["layers"].value<int64_t>() == 64);
    CHECK(tbl["model"]["profile"].value<std::string>() == "qwen-32b");
    CHECK(tbl["storage"]["block_tokens"].value<int64_t>() == 32);
    CHECK(has(res.out, "block_tokens = 32  # --set"));
    CHECK(has(res.out, "layers = 64  # profile qwen-32b"));
    CHECK(has(res.out, "profile = \"qwen-32b\"  # --model"));
  }
  // The plan flags are configuration overrides too.
  auto res = run({"plan", "--cnic-gbps", "200", "--print-config"});
  CHECK(has(res.out, "cnic_gbps = 200.0  # --cnic-gbps"));
}

TEST_CASE("config --reference prints the reference; config --json") {
  auto res = run({"config", "--reference"});
  REQUIRE(res.status == 0);
  CHECK(res.out == dualpath::config::reference_toml());
  res = run({"config", "--json", "--set", "run.decode_nodes=8"});
  REQUIRE(res.status == 0);
  auto doc = nlohmann::json::parse(res.out);
  CHECK(doc["run.decode_nodes"]["value"] == 8);
  CHECK(doc["run.decode_nodes"]["source"] == "--set");
  CHECK(doc["hardware.cnic_gbps"]["value"].get<double>() == 400);
  CHECK(doc["hardware.cnic_gbps"]["unit"] == "Gb/s");
  CHECK(doc.size() == dualpath::config::schema().size());
}
