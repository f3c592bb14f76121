// ctest-label: observability
// The metrics registry: Prometheus text exposition (HELP/TYPE lines, label
// escaping, cumulative histogram buckets with +Inf, _sum and _count), counters
// that never go down, collectors run before each render.
#include <doctest/doctest.h>

#include <map>
#include <sstream>

#include "actors/observe/metrics.hpp"

using namespace dualpath::actors::observe;

namespace {

// Parses sample lines `name{labels} value` into a map (comments skipped).
std::map<std::string, double> parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    auto sp = line.rfind(' ');
    REQUIRE(sp != std::string::npos);
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

} // namespace

TEST_CASE("standard families are declared with help and type") {
  metrics_registry m;
  auto text = m.render();
  for (auto name :
       {"dualpath_read_queue_tokens", "dualpath_reader_buffer_used_bytes",
        "dualpath_snic_bytes_total", "dualpath_ttft_seconds",
        "dualpath_tpot_seconds", "dualpath_errors_total",
        "dualpath_reroutes_total", "dualpath_bulk_tcp_fallback_total",
        "dualpath_gpu_staged_bytes_total"}) {
    CAPTURE(name);
    CHECK(text.find(std::string{"# HELP "} + name + " ") != std::string::npos);
    CHECK(text.find(std::string{"# TYPE "} + name + " ") != std::string::npos);
  }
  CHECK(text.find("# TYPE dualpath_ttft_seconds histogram")
        != std::string::npos);
  CHECK(text.find("# TYPE dualpath_snic_bytes_total counter")
        != std::string::npos);
  // No placeholder samples: a family shows series once it has some, each
  // with its own labels.
  CHECK(parse(text).empty());
  CHECK(text.find("\ndualpath_errors_total ") == std::string::npos);
  m.add("dualpath_errors_total", {{"source", "storage_reader"}});
  CHECK(parse(m.render()).size() == 1);
  // Every standard family has real help text and the counters end in _total.
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0)
      CHECK_MESSAGE(line.find("dualpath metric ") == std::string::npos, line);
    if (line.rfind("# TYPE ", 0) == 0) {
      auto counter =
          line.size() > 8 && line.compare(line.size() - 8, 8, " counter") == 0;
      auto name = line.substr(7, line.find(' ', 7) - 7);
      auto total =
          name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
      CHECK_MESSAGE(counter == total, line);
    }
  }
}

TEST_CASE("an undeclared _total series is a counter with a help line") {
  metrics_registry m;
  m.set("my_hits_total", {{"source", "x"}}, 3);
  m.set("my_level", {{"source", "x"}}, 4);
  auto text = m.render();
  CHECK(text.find("# TYPE my_hits_total counter") != std::string::npos);
  CHECK(text.find("# TYPE my_level gauge") != std::string::npos);
  CHECK(text.find("# HELP my_hits_total Reported by an actor")
        != std::string::npos);
}

TEST_CASE("counters, gauges and labels") {
  metrics_registry m;
  m.add("dualpath_snic_bytes_total", {{"node", "pe0"}}, 100);
  m.add("dualpath_snic_bytes_total", {{"node", "pe0"}}, 50);
  m.add("dualpath_snic_bytes_total", {{"node", "pe0"}}, -7); // ignored
  m.set("dualpath_read_queue_tokens", {{"node", "de0"}}, 64);
  m.set("dualpath_read_queue_tokens", {{"node", "de0"}}, 32);
  m.set("my_gauge", {{"path", "a\"b\\c\nd"}}, 1.5);
  auto text = m.render();
  auto v = parse(text);
  CHECK(v.at("dualpath_snic_bytes_total{node=\"pe0\"}") == 150);
  CHECK(v.at("dualpath_read_queue_tokens{node=\"de0\"}") == 32);
  CHECK(v.at("my_gauge{path=\"a\\\"b\\\\c\\nd\"}") == 1.5);
  CHECK(m.value("dualpath_snic_bytes_total", {{"node", "pe0"}}) == 150);
  CHECK(text.find("# TYPE my_gauge gauge") != std::string::npos);
}

TEST_CASE("histograms have cumulative buckets, +Inf, sum and count") {
  metrics_registry m;
  for (double x : {0.002, 0.002, 0.3, 7.0, 100.0})
    m.observe("dualpath_ttft_seconds", {}, x);
  auto v = parse(m.render());
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"0.001\"}") == 0);
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"0.0025\"}") == 2);
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"0.5\"}") == 3);
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"10\"}") == 4);
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"60\"}") == 4);
  CHECK(v.at("dualpath_ttft_seconds_bucket{le=\"+Inf\"}") == 5);
  CHECK(v.at("dualpath_ttft_seconds_count") == 5);
  CHECK(v.at("dualpath_ttft_seconds_sum") == doctest::Approx(107.304));
}

TEST_CASE("collectors run before each render and can be removed") {
  metrics_registry m;
  double level = 1;
  auto id = m.add_collector(
      [&](metrics_registry& r) { r.set("collected", {}, level); });
  CHECK(parse(m.render()).at("collected") == 1);
  level = 2;
  CHECK(parse(m.render()).at("collected") == 2);
  m.remove_collector(id);
  level = 3;
  CHECK(parse(m.render()).at("collected") == 2);
}

TEST_CASE("values are formatted as the text format expects") {
  CHECK(format_value(3) == "3");
  CHECK(format_value(0.001) == "0.001");
  CHECK(format_value(1.0 / 0.0) == "+Inf");
  CHECK(format_value(0.1 + 0.2) == "0.30000000000000004");
  CHECK(escape_label_value("x\"y") == "x\\\"y");
}
