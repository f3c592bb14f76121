// ctest-label: foundation
// `dualpath plan` as a real process: the paper's range, the brief's link-load
// table, and exit status 2 for infeasible inputs.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using nlohmann::json;

namespace {

json plan_json(std::vector<std::string> args) {
  args.insert(args.begin(), {dualpath_binary(), "plan", "--json"});
  auto res = run_process(args);
  REQUIRE_MESSAGE(res.status == 0, res.err);
  CHECK(res.err.empty());
  return json::parse(res.out);
}

int lines(const std::string& str) {
  int n = 0;
  for (auto c : str)
    n += c == '\n';
  return n;
}

} // namespace

TEST_CASE("defaults give 1/7 <= P/D <= 7/2") {
  auto doc = plan_json({});
  CHECK(doc["pd_min"].get<double>() == doctest::Approx(1.0 / 7).epsilon(1e-12));
  CHECK(doc["pd_max"].get<double>() == 3.5);
  CHECK(doc["pd_min_fraction"] == "1/7");
  CHECK(doc["pd_max_fraction"] == "7/2");
  CHECK(doc["binding_min"] == "pe_cnic_write");
  CHECK(doc["binding_max"] == "de_cnic_write,de_dram");
  CHECK_FALSE(doc.contains("links"));
  CHECK_FALSE(doc.contains("bottleneck_free"));
  auto human = run_process({dualpath_binary(), "plan"});
  CHECK(human.status == 0);
  CHECK(human.out.find("1/7 <= P/D <= 7/2") != std::string::npos);
  CHECK(human.out.find("0.142857 <= P/D <= 3.5") != std::string::npos);
}

TEST_CASE("the brief's link-load table, through the command") {
  struct row {
    int p, d;
    double pe_rd, pe_wr, de_rd, de_wr, pe_dram, de_dram;
  };
  row table[] = {{1, 1, 12.5, 12.5, 18.75, 18.75, 100, 250},
                 {2, 4, 12.5, 18.75, 15.625, 12.5, 100, 200},
                 {2, 1, 12.5, 9.375, 25, 31.25, 100, 350}};
  for (auto& r : table) {
    CAPTURE(r.p);
    CAPTURE(r.d);
    auto doc = plan_json({"--prefill-nodes", std::to_string(r.p),
                          "--decode-nodes", std::to_string(r.d)});
    auto& links = doc["links"];
    CHECK(links["pe_cnic_read"]["load_gbs"].get<double>() == r.pe_rd);
    CHECK(links["pe_cnic_write"]["load_gbs"].get<double>() == r.pe_wr);
    CHECK(links["de_cnic_read"]["load_gbs"].get<double>() == r.de_rd);
    CHECK(links["de_cnic_write"]["load_gbs"].get<double>() == r.de_wr);
    CHECK(links["pe_dram"]["load_gbs"].get<double>() == r.pe_dram);
    CHECK(links["de_dram"]["load_gbs"].get<double>() == r.de_dram);
    CHECK(links["pe_cnic_read"]["capacity_gbs"].get<double>() == 50);
    CHECK(links["de_dram"]["capacity_gbs"].get<double>() == 500);
    CHECK(links["de_dram"]["utilisation"].get<double>() == r.de_dram / 500);
    CHECK(doc["bottleneck_free"] == true);
  }
  // Outside the range: 1P8D overloads the prefill compute NICs' writes.
  auto doc = plan_json({"--prefill-nodes", "1", "--decode-nodes", "8"});
  CHECK(doc["bottleneck_free"] == false);
  CHECK(doc["links"]["pe_cnic_write"]["utilisation"].get<double>() == 1.125);
}

TEST_CASE("flags and configuration change the inputs") {
  auto doc = plan_json({"--snic-gbps", "800", "--dram-gbs", "2000"});
  CHECK(doc["pd_min_fraction"] == "1/3");
  CHECK(doc["pd_max_fraction"] == "3/2");
  CHECK(doc["binding_max"] == "de_cnic_write");
  // Two storage NICs per node double the node's storage bandwidth.
  auto two =
      plan_json({"--set", "hardware.snic_per_node=2", "--dram-gbs", "2000"});
  CHECK(two["pd_min_fraction"] == "1/3");
  dualpath::test::temp_dir dir;
  auto file = dir.file("hw.toml");
  dualpath::test::write_file(file, "[hardware]\ngpus_per_node = 4\n"
                                   "cnic_gbps = 200\nsnic_gbps = 200\n");
  doc = plan_json({"--config", file, "--dram-gbs", "1000"});
  // g = 4, s = 1: 1/3 <= P/D <= min(2, 3/2, (40-3)/2) = 3/2.
  CHECK(doc["pd_min_fraction"] == "1/3");
  CHECK(doc["pd_max_fraction"] == "3/2");
  // --json FILE writes the file and nothing to stdout.
  auto out = dir.file("plan.json");
  auto res = run_process({dualpath_binary(), "plan", "--json", out});
  REQUIRE(res.status == 0);
  CHECK(res.out.empty());
  std::ifstream in{out};
  std::stringstream buf;
  buf << in.rdbuf();
  CHECK(json::parse(buf.str())["pd_max"].get<double>() == 3.5);
}

TEST_CASE("infeasible inputs exit 2 with one clear message") {
  auto check = [](std::vector<std::string> args, const std::string& part) {
    args.insert(args.begin(), {dualpath_binary(), "plan"});
    auto res = run_process(args);
    CAPTURE(res.err);
    CHECK(res.status == 2);
    CHECK(res.out.empty());
    CHECK(lines(res.err) == 1);
    CHECK(res.err.find(part) != std::string::npos);
  };
  // Storage above half the node's compute-NIC bandwidth (s > g/2).
  check({"--snic-gbps", "1700"}, "exceeds half the node's compute-NIC");
  check({"--dram-gbs", "100"}, "no bottleneck-free P/D exists");
  check({"--cnic-gbps", "-400"}, "'hardware.cnic_gbps' = -400.0");
  check({"--cnic-gbps", "0"}, "out of range");
  check({"--gpus-per-node", "0"}, "'hardware.gpus_per_node' = 0");
  check({"--prefill-nodes", "2"}, "give both");
  check({"--prefill-nodes", "0", "--decode-nodes", "4"}, "positive");
  check({"--snic-gbps", "fast"}, "wrong type");
}
