// ctest-label: observability
// Observability of `dualpath run` as a real process:
//  - its Prometheus endpoint, scraped with curl while it runs, gives
//    parseable text (every sample line of a declared family) whose counters
//    move as work is done and never go down;
//  - malformed or wrong HTTP requests get 4xx answers and the endpoint keeps
//    serving;
//  - --trace writes valid Chrome trace-event JSON in which every request has
//    its prefill and decode spans and every layer of every request its
//    compute and send spans inside them, and every track nests;
//  - docs/observability.md lists every family served, with its type and
//    its labels;
//  - the extension example (storage.reader = "prefetching") runs in a small
//    run, verifies every block, and its own metrics reach /metrics.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/cmd/small_cluster.hpp"
#include "tests/support/support.hpp"

using dualpath::test::background_process;
using dualpath::test::dualpath_binary;
using dualpath::test::free_port;
using dualpath::test::temp_dir;
using nlohmann::json;

namespace {

// curl's output, or "" when the request failed.
std::string curl(uint16_t port, const std::string& path = "/metrics") {
  auto cmd = "curl -sS --fail --max-time 3 http://127.0.0.1:"
             + std::to_string(port) + path + " 2>/dev/null";
  auto* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return {};
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    out.append(buf, n);
  if (::pclose(p) != 0)
    return {};
  return out;
}

// Parses the text exposition format strictly: every sample line is
// `name{labels} value` of a family with a # TYPE line. Returns the samples
// (key: name with labels) or fails the test.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex sample{
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? ([-+]?([0-9.eE+-]+|Inf|NaN))$)"};
  static const std::regex type_line{
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)"};
  std::map<std::string, std::string> types;
  std::map<std::string, double> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0)
      continue;
    if (std::regex_match(line, m, type_line)) {
      types[m[1]] = m[2];
      continue;
    }
    REQUIRE_MESSAGE(std::regex_match(line, m, sample), "bad line: " << line);
    std::string name = m[1];
    auto family = name;
    for (auto suffix : {"_bucket", "_sum", "_count"})
      if (types.count(family) == 0 && family.size() > std::strlen(suffix)
          && family.compare(family.size() - std::strlen(suffix),
                            std::string::npos, suffix)
                 == 0)
        family = family.substr(0, family.size() - std::strlen(suffix));
    CHECK_MESSAGE(types.count(family) == 1, "no # TYPE for " << name);
    auto value = line.substr(line.rfind(' ') + 1);
    out[line.substr(0, line.rfind(' '))] =
        value == "+Inf" ? 1e308 : std::stod(value);
  }
  return out;
}

// Sum of every series of `family` (counters and gauges).
double total(const std::map<std::string, double>& xs,
             const std::string& family) {
  double sum = 0;
  for (auto& [k, v] : xs)
    if (k == family || k.rfind(family + "{", 0) == 0)
      sum += v;
  return sum;
}

// Runs `cmd` (a shell command line); its exit status and output.
std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  auto* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr)
    return {-1, "popen failed"};
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    out.append(buf, n);
  auto status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// One row of docs/observability.md's metric table: its type and every name
// in backticks of its labels column (the label names and their values).
struct documented_metric {
  std::string type;
  std::set<std::string> labels;
};

// The metric table of docs/observability.md: rows `| `name`[, `name`] | type |
// unit | labels | meaning |`, by family name.
std::map<std::string, documented_metric> documented_metrics() {
  std::ifstream in{std::string{DUALPATH_SOURCE_DIR} + "/docs/observability.md"};
  REQUIRE_MESSAGE(in.good(), "cannot read docs/observability.md");
  static const std::regex quoted{"`([^`]+)`"};
  std::map<std::string, documented_metric> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `dualpath_", 0) != 0)
      continue;
    std::vector<std::string> cells;
    std::istringstream row{line.substr(1)};
    std::string cell;
    while (std::getline(row, cell, '|'))
      cells.push_back(cell);
    REQUIRE_MESSAGE(cells.size() >= 5, "short metric row: " << line);
    documented_metric d;
    std::istringstream type{cells[1]};
    type >> d.type;
    for (std::sregex_iterator i{cells[3].begin(), cells[3].end(), quoted}, end;
         i != end; ++i)
      d.labels.insert((*i)[1]);
    for (std::sregex_iterator i{cells[0].begin(), cells[0].end(), quoted}, end;
         i != end; ++i)
      out[(*i)[1]] = d;
  }
  REQUIRE_MESSAGE(out.size() >= 20, "docs/observability.md: no metric table");
  return out;
}

// docs/observability.md lists every family of a scrape with its type and
// every label its series carry (a histogram's `le` aside): the metric
// reference is what the endpoint serves now.
void check_documented(const std::string& text) {
  static const auto docs = documented_metrics();
  static const std::regex type_line{R"(^# TYPE (\S+) (\S+)$)"};
  static const std::regex label{
      R"(([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*")"};
  std::map<std::string, std::string> types;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, type_line)) {
      types[m[1]] = m[2];
      auto doc = docs.find(m[1]);
      CHECK_MESSAGE(doc != docs.end(),
                    m[1] << " is served but not in docs/observability.md");
      if (doc != docs.end())
        CHECK_MESSAGE(doc->second.type == m[2].str(), m[1] << " is a " << m[2]
                                                           << ", documented as "
                                                           << doc->second.type);
      continue;
    }
    if (line.empty() || line[0] == '#')
      continue;
    auto name = line.substr(0, line.find_first_of("{ "));
    auto family = name;
    for (std::string suffix : {"_bucket", "_sum", "_count"})
      if (types.count(family) == 0 && family.size() > suffix.size()
          && family.compare(family.size() - suffix.size(), suffix.size(),
                            suffix)
                 == 0)
        family.resize(family.size() - suffix.size());
    auto doc = docs.find(family);
    if (doc == docs.end())
      continue; // reported at its # TYPE line
    auto open = line.find('{');
    auto close = line.rfind('}');
    if (open == std::string::npos || close == std::string::npos)
      continue;
    auto labels = line.substr(open + 1, close - open - 1);
    for (std::sregex_iterator i{labels.begin(), labels.end(), label}, end;
         i != end; ++i) {
      auto key = (*i)[1].str();
      if (key == "le" && types[family] == "histogram")
        continue;
      CHECK_MESSAGE(doc->second.labels.count(key) == 1,
                    family << " carries label " << key
                           << ", not in its docs/observability.md row");
    }
  }
}

// Every scrape passes the ecosystem's own checks: `promtool check metrics`
// (Prometheus's linter: types, _total counters, units, help) and the
// official Python client's parser; and docs/observability.md documents what
// it serves. Both come from Debian packages that
// setup.sh installs (prometheus, python3-prometheus-client); a missing
// tool fails the test, never skips it.
void check_every_scrape(const temp_dir& dir,
                        const std::vector<std::string>& scrapes) {
  REQUIRE_MESSAGE(shell("command -v promtool").first == 0,
                  "promtool not found: ./setup.sh deps installs the Debian "
                  "package prometheus");
  REQUIRE_MESSAGE(
      shell("/usr/bin/python3 -c 'import prometheus_client'").first == 0,
      "prometheus_client not importable by /usr/bin/python3: ./setup.sh deps "
      "installs python3-prometheus-client");
  auto file = dir.file("scrape.txt");
  size_t i = 0;
  for (auto& text : scrapes) {
    CAPTURE(i++);
    dualpath::test::write_file(file, text);
    auto lint = shell("promtool check metrics < " + file);
    CHECK_MESSAGE(lint.first == 0, "promtool: " << lint.second);
    CHECK_MESSAGE(lint.second.empty(), "promtool: " << lint.second);
    auto parsed =
        shell("/usr/bin/python3 -c 'import sys; from prometheus_client.parser "
              "import text_string_to_metric_families as parse; "
              "print(len(list(parse(open(sys.argv[1]).read()))))' "
              + file);
    CHECK_MESSAGE(parsed.first == 0, "prometheus_client: " << parsed.second);
    CHECK(std::atoi(parsed.second.c_str()) >= 20);
    check_documented(text);
  }
}

// The status code of the answer to `request` sent on a raw connection.
int raw_status(uint16_t port, const std::string& request) {
  int fd = dualpath::test::connect_loopback(port);
  if (fd < 0)
    return -1;
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  auto answer = dualpath::test::read_to_end(fd);
  ::close(fd);
  if (answer.compare(0, 9, "HTTP/1.1 ") != 0)
    return -1;
  return std::stoi(answer.substr(9, 3));
}

// `dualpath run` on the small cluster (tests/cmd/small_cluster.hpp), four
// agents, its store in `dir`.
std::vector<std::string> small_run(const temp_dir& dir,
                                   std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--store-dir", dir.file("store")});
  return dualpath::test::small_cluster("run", "4", extra);
}

// Scrapes every 200 ms while `run` runs; returns the successful scrapes.
std::vector<std::string> scrape_while(background_process& run, uint16_t port) {
  std::vector<std::string> scrapes;
  while (run.running()) {
    auto text = curl(port);
    if (!text.empty())
      scrapes.push_back(std::move(text));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return scrapes;
}

struct span {
  std::string name;
  double ts = 0;
  double dur = 0;
  int pid = 0;
  int tid = 0;
  uint64_t request = 0;
  int layer = -1;
};

bool inside(const span& x, const span& outer) {
  const double eps = 0.002; // us: rounding of ns to the JSON's 3 decimals
  return outer.ts - eps <= x.ts && x.ts + x.dur <= outer.ts + outer.dur + eps;
}

} // namespace

TEST_CASE("a running dualpath run: metrics move, bad HTTP is refused, the "
          "timeline nests") {
  temp_dir dir;
  auto port = free_port();
  auto trace = dir.file("trace.json");
  background_process run{
      small_run(dir, {"--mode", "basic,dualpath", "--turns", "3",
                      "--time-scale", "4", "--metrics-port",
                      std::to_string(port), "--trace", trace}),
      dir.file("run.out"), dir.file("run.err")};
  // Wait for the endpoint, then refuse some bad requests while it works.
  std::string first;
  for (int i = 0; i < 600 && first.empty() && run.running(); ++i) {
    first = curl(port);
    if (first.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE_MESSAGE(!first.empty(), "no endpoint; stderr: " << run.err());
  CHECK(raw_status(port, "GET metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(raw_status(port, "GARBAGE\r\n\r\n") == -1); // not HTTP: closed
  CHECK(raw_status(port, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n") == 404);
  CHECK(raw_status(port, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 405);
  CHECK(raw_status(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n"
                         "Content-Length: 100000000\r\n\r\n")
        == 413);
  CHECK(raw_status(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nX: "
                             + std::string(40000, 'x') + "\r\n\r\n")
        == 431);
  auto scrapes = scrape_while(run, port);
  scrapes.insert(scrapes.begin(), first);
  REQUIRE_MESSAGE(run.wait() == 0, run.err());
  MESSAGE(scrapes.size() << " scrapes");
  REQUIRE(scrapes.size() >= 2);
  // Parseable, counters never go down, and they moved.
  std::vector<std::map<std::string, double>> parsed;
  for (auto& s : scrapes)
    parsed.push_back(parse_prometheus(s));
  for (size_t i = 1; i < parsed.size(); ++i)
    for (auto& kv : parsed[i - 1]) {
      // Not structured bindings: doctest's message macros capture them in
      // a lambda, which C++17 does not allow (clang).
      const auto& k = kv.first;
      if (k.find("_total") != std::string::npos && parsed[i].count(k))
        CHECK_MESSAGE(parsed[i].at(k) >= kv.second, k);
    }
  check_every_scrape(dir, scrapes);
  auto& a = parsed.front();
  auto& b = parsed.back();
  for (auto family :
       {"dualpath_snic_bytes_total", "dualpath_requests_completed_total",
        "dualpath_prefill_layers_total",
        "dualpath_storage_blocks_read_total"}) {
    CAPTURE(family);
    CHECK(total(b, family) > total(a, family));
  }
  CHECK(total(b, "dualpath_ttft_seconds_count") > 0);
  double buffer_peak = 0;
  for (auto& x : parsed)
    buffer_peak =
        std::max(buffer_peak, total(x, "dualpath_reader_buffer_used_bytes"));
  CHECK(buffer_peak > 0);
  // Declared even without series (no placeholder samples).
  CHECK(scrapes.back().find("# TYPE dualpath_bulk_tcp_fallback_total counter")
        != std::string::npos);
  // Per node from each bulk backend's counters; an in-process run's local
  // transport never falls back (tests/transport/bulk/auto_backend.cpp
  // counts real fallbacks).
  CHECK(scrapes.back().find("dualpath_bulk_tcp_fallback_total{mode=")
        != std::string::npos);
  CHECK(total(b, "dualpath_bulk_tcp_fallback_total") == 0);
  CHECK(scrapes.back().find("# TYPE dualpath_errors_total counter")
        != std::string::npos);
  // Both modes ran in this process: every cluster series names its mode.
  for (auto family :
       {"dualpath_snic_bytes_total", "dualpath_requests_completed_total"}) {
    CAPTURE(family);
    bool basic = false;
    bool dualpath = false;
    for (auto& kv : b) {
      const auto& k = kv.first; // not a binding: CHECK_MESSAGE captures it
      if (k.rfind(family, 0) != 0)
        continue;
      CHECK_MESSAGE(k.find("mode=\"") != std::string::npos, k);
      basic = basic || k.find("mode=\"basic\"") != std::string::npos;
      dualpath = dualpath || k.find("mode=\"dualpath\"") != std::string::npos;
    }
    CHECK(basic);
    CHECK(dualpath);
  }
  // The timeline.
  std::ifstream in{trace};
  REQUIRE(in);
  auto doc = json::parse(in);
  std::map<int, std::string> process;
  std::vector<span> spans;
  for (auto& ev : doc.at("traceEvents")) {
    if (ev["ph"] == "M" && ev["name"] == "process_name")
      process[ev["pid"].get<int>()] = ev["args"]["name"];
    if (ev["ph"] != "X")
      continue;
    span s;
    s.name = ev["name"];
    s.ts = ev["ts"];
    s.dur = ev["dur"];
    s.pid = ev["pid"];
    s.tid = ev["tid"];
    s.request = ev["args"]["request"];
    if (ev["args"].contains("layer"))
      s.layer = ev["args"]["layer"];
    CHECK(s.dur >= 0);
    spans.push_back(s);
  }
  // Flows: every layer's send on a prefill node starts one, and it ends on
  // that layer's arrival at a decode node.
  std::map<uint64_t, const json*> flow_start, flow_end;
  size_t sends = 0;
  for (auto& ev : doc.at("traceEvents")) {
    if (ev["ph"] == "s")
      flow_start[ev["id"].get<uint64_t>()] = &ev;
    if (ev["ph"] == "f")
      flow_end[ev["id"].get<uint64_t>()] = &ev;
    if (ev["ph"] == "X" && ev["name"] == "send")
      ++sends;
  }
  CHECK(sends > 0);
  CHECK(flow_start.size() == sends);
  for (auto& [id, st] : flow_start) {
    REQUIRE(flow_end.count(id) == 1);
    auto& en = *flow_end[id];
    CHECK((*st)["args"] == en["args"]);
    auto from = process[(*st)["pid"].get<int>()];
    auto to = process[en["pid"].get<int>()];
    CHECK_MESSAGE(from.find(" pe") != std::string::npos, from);
    CHECK_MESSAGE(to.find(" de") != std::string::npos, to);
    CHECK((*st)["ts"].get<double>() <= en["ts"].get<double>() + 0.002);
  }
  // Every track nests.
  std::map<std::pair<int, int>, std::vector<const span*>> tracks;
  for (auto& s : spans)
    tracks[{s.pid, s.tid}].push_back(&s);
  for (auto& track : tracks) {
    // Not structured bindings: CHECK_MESSAGE captures them in a lambda.
    const auto& key = track.first;
    const auto& xs = track.second;
    for (auto* x : xs)
      for (auto* y : xs) {
        if (x == y)
          continue;
        bool disjoint =
            x->ts + x->dur <= y->ts + 0.002 || y->ts + y->dur <= x->ts + 0.002;
        CHECK_MESSAGE((disjoint || inside(*x, *y) || inside(*y, *x)),
                      x->name << " and " << y->name << " overlap on pid "
                              << key.first << " tid " << key.second);
      }
  }
  // Every request: prefill and decode spans; every layer: compute and send
  // inside its prefill span.
  std::map<std::string, std::map<uint64_t, const span*>> prefill_of;
  std::map<std::string, std::set<uint64_t>> decoded;
  std::set<int> layers;
  for (auto& s : spans) {
    auto mode = process[s.pid].substr(0, process[s.pid].find(' '));
    if (s.name == "prefill")
      prefill_of[mode][s.request] = &s;
    if (s.name == "decode")
      decoded[mode].insert(s.request);
    if (s.layer >= 0)
      layers.insert(s.layer);
  }
  REQUIRE(prefill_of.size() == 2); // basic and dualpath
  REQUIRE(!layers.empty());
  CHECK(*layers.rbegin() + 1 == static_cast<int>(layers.size()));
  for (auto& by_mode : prefill_of) {
    // Not structured bindings: CAPTURE keeps a reference in a lambda.
    const auto& mode = by_mode.first;
    const auto& reqs = by_mode.second;
    CAPTURE(mode);
    CHECK(reqs.size() == 12); // 4 agents x 3 turns
    CHECK(decoded[mode].size() == reqs.size());
    for (auto& by_id : reqs) {
      const auto id = by_id.first;
      const auto* pre = by_id.second;
      CAPTURE(id);
      std::map<std::string, std::set<int>> steps;
      for (auto& s : spans)
        if (s.request == id && s.layer >= 0
            && process[s.pid].rfind(mode + " ", 0) == 0) {
          // The arrival at the decode node is on that node, not in the
          // prefill (its flow from the send is checked above).
          if (s.name != "receive")
            CHECK_MESSAGE(inside(s, *pre), s.name << " of layer " << s.layer);
          steps[s.name].insert(s.layer);
        }
      CHECK(steps["compute"].size() == layers.size());
      CHECK(steps["send"].size() == layers.size());
      CHECK(steps["receive"].size() == layers.size());
      // Hit blocks reach the GPU per layer: locally (h2d) or pushed from the
      // decode node (transfer).
      std::set<int> loaded = steps["h2d"];
      loaded.insert(steps["transfer"].begin(), steps["transfer"].end());
      CHECK(loaded.size() == layers.size());
    }
  }
}

TEST_CASE("the extension example: a run with the prefetching reader") {
  temp_dir dir;
  auto port = free_port();
  background_process run{
      small_run(dir, {"--mode", "dualpath", "--turns", "3", "--time-scale", "4",
                      "--json", "--set", "storage.reader=prefetching",
                      "--metrics-port", std::to_string(port)}),
      dir.file("run.out"), dir.file("run.err")};
  auto scrapes = scrape_while(run, port);
  REQUIRE_MESSAGE(run.wait() == 0, run.err());
  auto doc = json::parse(run.out());
  auto& m = doc["modes"]["dualpath"];
  CHECK(m["verify_failures"] == 0);
  CHECK(m["blocks_verified"].get<double>() > 0);
  REQUIRE(!scrapes.empty());
  check_every_scrape(dir, scrapes);
  double prefetched = 0;
  for (auto& s : scrapes)
    prefetched = std::max(prefetched, total(parse_prometheus(s),
                                            "dualpath_prefetch_blocks_total"));
  CHECK(prefetched > 0);
}
