// ctest-label: observability
// The timeline writer: lanes keep every thread track properly nested, the
// output is valid Chrome trace-event JSON with named processes and threads.
#include <doctest/doctest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "actors/observe/timeline.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::actors::observe;

namespace {

span_record span(const std::string& track, const std::string& name, int64_t b,
                 int64_t e, uint64_t req = 1, int32_t layer = -1) {
  return span_record{"pe0", track, name, req, layer, b, e, 0};
}

// True when every two spans of one lane are nested or disjoint.
bool lanes_nest(const std::vector<placed_span>& xs) {
  for (auto& a : xs)
    for (auto& b : xs) {
      if (&a == &b || a.lane != b.lane)
        continue;
      auto& x = a.span;
      auto& y = b.span;
      bool disjoint = x.end_ns <= y.begin_ns || y.end_ns <= x.begin_ns;
      bool x_in_y = y.begin_ns <= x.begin_ns && x.end_ns <= y.end_ns;
      bool y_in_x = x.begin_ns <= y.begin_ns && y.end_ns <= x.end_ns;
      if (!disjoint && !x_in_y && !y_in_x)
        return false;
    }
  return true;
}

} // namespace

TEST_CASE("nested spans share a lane, overlapping ones get another") {
  auto placed = assign_lanes({span("gpu0", "prefill", 0, 100),
                              span("gpu0", "compute", 10, 20, 1, 0),
                              span("gpu0", "compute", 20, 30, 1, 1),
                              span("gpu0", "prefill", 50, 150, 2)});
  REQUIRE(placed.size() == 4);
  CHECK(lanes_nest(placed));
  uint32_t lanes = 0;
  for (auto& p : placed) {
    lanes = std::max(lanes, p.lane + 1);
    if (p.span.name == "compute")
      CHECK(p.lane == 0); // inside the first prefill
  }
  CHECK(lanes == 2);
}

TEST_CASE("many random overlapping spans always nest per lane") {
  std::vector<span_record> xs;
  uint64_t seed = 7;
  auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>(seed >> 40) % 1000;
  };
  for (int i = 0; i < 300; ++i) {
    auto b = next();
    xs.push_back(span("cnic0", "h2d", b, b + next() % 100, i));
  }
  CHECK(lanes_nest(assign_lanes(xs)));
}

TEST_CASE("the trace is valid JSON with named processes and threads") {
  timeline t;
  t.set_section("dualpath");
  t.add(span("gpu0", "prefill", 0, 2'000'000));
  t.add(span("gpu0", "compute", 1'000, 501'000, 1, 0));
  t.add(span_record{"de0", "gpu0", "decode \"quoted\"", 1, -1, 2'000'000,
                    3'000'000, 42});
  dualpath::test::temp_dir dir;
  auto path = dir.file("trace.json");
  REQUIRE(!t.write(path));
  std::ifstream in{path};
  auto doc = nlohmann::json::parse(in);
  REQUIRE(doc.contains("traceEvents"));
  std::map<std::string, int> processes;
  int complete = 0;
  for (auto& ev : doc["traceEvents"]) {
    if (ev["ph"] == "M" && ev["name"] == "process_name")
      processes[ev["args"]["name"]] = ev["pid"];
    if (ev["ph"] == "X") {
      ++complete;
      CHECK(ev["args"].contains("request"));
      if (ev["name"] == "compute") {
        CHECK(ev["ts"].get<double>() == doctest::Approx(1.0));
        CHECK(ev["dur"].get<double>() == doctest::Approx(500.0));
        CHECK(ev["args"]["layer"] == 0);
      }
    }
  }
  CHECK(complete == 3);
  CHECK(processes.count("dualpath pe0") == 1);
  CHECK(processes.count("dualpath de0") == 1);
}

TEST_CASE("each layer's send flows to its arrival at the decode node") {
  timeline t;
  t.set_section("dualpath");
  for (int32_t l = 0; l < 3; ++l) {
    t.add(span_record{"pe0", "cnic0 tx", "send", 7, l, 100 + 10 * l,
                      105 + 10 * l, 64});
    t.add(span_record{"de1", "cnic0 rx", "receive", 7, l, 103 + 10 * l,
                      109 + 10 * l, 64});
  }
  // Another mode's request 7: its own flows, never crossed with these.
  t.set_section("basic");
  t.add(span_record{"pe0", "cnic0 tx", "send", 7, 0, 500, 505, 64});
  t.add(span_record{"de0", "cnic0 rx", "receive", 7, 0, 506, 509, 64});
  // A name with characters JSON must escape.
  t.add(span_record{"de0", "gpu0", "quote\" back\\slash\n", 8, -1, 1, 2, 0});
  auto doc = nlohmann::json::parse(t.to_json());
  std::map<int, std::string> process;
  std::map<uint64_t, nlohmann::json> starts, ends;
  bool escaped = false;
  for (auto& ev : doc["traceEvents"]) {
    if (ev["ph"] == "M" && ev["name"] == "process_name")
      process[ev["pid"].get<int>()] = ev["args"]["name"];
    if (ev["ph"] == "s")
      starts[ev["id"].get<uint64_t>()] = ev;
    if (ev["ph"] == "f")
      ends[ev["id"].get<uint64_t>()] = ev;
    if (ev["ph"] == "X" && ev["name"] == "quote\" back\\slash\n")
      escaped = true;
  }
  CHECK(escaped);
  REQUIRE(starts.size() == 4);
  REQUIRE(ends.size() == 4);
  for (auto& [id, s] : starts) {
    REQUIRE(ends.count(id) == 1);
    auto& f = ends[id];
    CHECK(f["bp"] == "e");
    CHECK(s["args"] == f["args"]); // the same request and layer
    auto from = process[s["pid"].get<int>()];
    auto to = process[f["pid"].get<int>()];
    CHECK(from.substr(from.find(' ')) == " pe0");
    CHECK(from.substr(0, from.find(' ')) == to.substr(0, to.find(' ')));
    CHECK(to.substr(to.find(' ') + 1).rfind("de", 0) == 0);
    CHECK(s["ts"].get<double>() <= f["ts"].get<double>());
    // Each end lies on a slice of its track (the send, the arrival).
    bool on_send = false, on_arrival = false;
    for (auto& ev : doc["traceEvents"]) {
      if (ev["ph"] != "X")
        continue;
      if (ev["pid"] == s["pid"] && ev["tid"] == s["tid"] && ev["ts"] == s["ts"]
          && ev["name"] == "send")
        on_send = true;
      if (ev["pid"] == f["pid"] && ev["tid"] == f["tid"] && ev["ts"] == f["ts"]
          && ev["name"] == "receive")
        on_arrival = true;
    }
    CHECK(on_send);
    CHECK(on_arrival);
  }
}
