#include "actors/observe/timeline.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace dualpath::actors::observe {

namespace {

using nlohmann::json;

// Microseconds (the format's unit) from emulated nanoseconds; a double
// holds every ns of a run exactly (< 2^53 ns = 104 days).
double micros(int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}

// Where a placed span landed: its process, lane track and begin.
struct slot {
  size_t pid = 0;
  uint32_t tid = 0;
  int64_t ts_ns = 0;
};

} // namespace

std::vector<placed_span> assign_lanes(std::vector<span_record> spans) {
  // Outer spans first: by begin, then longer first.
  std::stable_sort(spans.begin(), spans.end(), [](auto& a, auto& b) {
    if (a.begin_ns != b.begin_ns)
      return a.begin_ns < b.begin_ns;
    return a.end_ns > b.end_ns;
  });
  std::vector<std::vector<int64_t>> lanes; // per lane: ends of open spans
  std::vector<placed_span> out;
  out.reserve(spans.size());
  for (auto& s : spans) {
    auto end = std::max(s.end_ns, s.begin_ns);
    uint32_t lane = 0;
    for (; lane < lanes.size(); ++lane) {
      auto& open = lanes[lane];
      while (!open.empty() && open.back() <= s.begin_ns)
        open.pop_back();
      if (open.empty() || end <= open.back())
        break;
    }
    if (lane == lanes.size())
      lanes.emplace_back();
    lanes[lane].push_back(end);
    out.push_back(placed_span{std::move(s), lane});
  }
  return out;
}

void timeline::set_section(const std::string& section) {
  std::lock_guard<std::mutex> guard{mtx_};
  section_ = section;
}

void timeline::add(span_record x) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (!section_.empty())
    x.node = section_ + " " + x.node;
  spans_.push_back(std::move(x));
}

size_t timeline::size() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return spans_.size();
}

std::string timeline::to_json() const {
  // Group by process (node) and track, in order of first appearance.
  std::vector<std::string> nodes;
  std::map<std::string, std::vector<std::string>> tracks;
  std::map<std::pair<std::string, std::string>, std::vector<span_record>>
      by_track;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& s : spans_) {
      auto& ts = tracks[s.node];
      if (ts.empty())
        nodes.push_back(s.node);
      auto key = std::make_pair(s.node, s.track);
      auto& v = by_track[key];
      if (v.empty())
        ts.push_back(s.track);
      v.push_back(s);
    }
  }
  auto events = json::array();
  auto meta = [&](const char* name, size_t pid, uint32_t tid, json args) {
    events.push_back({{"name", name},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", std::move(args)}});
  };
  // A layer's send on the prefill node and its arrival at the decode node,
  // by (section, request, layer): the ends of one flow.
  using flow_key = std::tuple<std::string, uint64_t, int32_t>;
  std::map<flow_key, std::vector<slot>> sends;
  std::map<flow_key, std::vector<slot>> arrivals;
  for (size_t p = 0; p < nodes.size(); ++p) {
    auto pid = p + 1;
    meta("process_name", pid, 0, {{"name", nodes[p]}});
    meta("process_sort_index", pid, 0, {{"sort_index", pid}});
    uint32_t tid = 1;
    for (auto& track : tracks[nodes[p]]) {
      auto placed = assign_lanes(by_track[{nodes[p], track}]);
      uint32_t lanes = 0;
      for (auto& x : placed)
        lanes = std::max(lanes, x.lane + 1);
      for (uint32_t l = 0; l < lanes; ++l) {
        auto name = l == 0 ? track : track + " #" + std::to_string(l + 1);
        meta("thread_name", pid, tid + l, {{"name", name}});
        meta("thread_sort_index", pid, tid + l, {{"sort_index", tid + l}});
      }
      for (auto& x : placed) {
        auto& s = x.span;
        json args = {{"request", s.request_id}};
        if (s.layer >= 0)
          args["layer"] = s.layer;
        if (s.bytes > 0)
          args["bytes"] = s.bytes;
        events.push_back(
            {{"name", s.name},
             {"cat", s.name},
             {"ph", "X"},
             {"ts", micros(s.begin_ns)},
             {"dur", micros(std::max<int64_t>(0, s.end_ns - s.begin_ns))},
             {"pid", pid},
             {"tid", tid + x.lane},
             {"args", std::move(args)}});
        if (s.layer >= 0 && (s.name == "send" || s.name == "receive")) {
          auto& ends = s.name == "send" ? sends : arrivals;
          auto space = s.node.rfind(' ');
          auto section = space == std::string::npos ? std::string{}
                                                    : s.node.substr(0, space);
          ends[{section, s.request_id, s.layer}].push_back(
              slot{pid, tid + x.lane, s.begin_ns});
        }
      }
      tid += std::max<uint32_t>(lanes, 1);
    }
  }
  // Flow events (v1: "s" binds to the slice it starts in, "f" with
  // binding point "e" to the slice it ends in): one arrow per layer and
  // request from the send's slice to the arrival's.
  uint64_t flow_id = 1;
  for (auto& entry : sends) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang).
    const auto& key = entry.first;
    auto& out = entry.second;
    auto in = arrivals.find(key);
    if (in == arrivals.end())
      continue;
    auto n = std::min(out.size(), in->second.size());
    for (size_t k = 0; k < n; ++k, ++flow_id) {
      auto& a = out[k];
      auto& b = in->second[k];
      auto end = [&](const char* ph, const slot& at) {
        return json{
            {"name", "layer kv"},
            {"cat", "layer kv"},
            {"ph", ph},
            {"id", flow_id},
            {"ts", micros(at.ts_ns)},
            {"pid", at.pid},
            {"tid", at.tid},
            {"args",
             {{"request", std::get<1>(key)}, {"layer", std::get<2>(key)}}}};
      };
      events.push_back(end("s", a));
      auto last = end("f", b);
      last["bp"] = "e";
      events.push_back(std::move(last));
    }
  }
  json doc = {
      {"displayTimeUnit", "ms"},
      {"otherData", {{"clock", "emulated time since the cluster's start"}}},
      {"traceEvents", std::move(events)}};
  return doc.dump() + "\n";
}

caf::error timeline::write(const std::string& path) const {
  auto tmp = path + ".tmp";
  {
    std::ofstream out{tmp, std::ios::binary | std::ios::trunc};
    if (!out)
      return caf::make_error(caf::sec::runtime_error,
                             "--trace: cannot write " + tmp);
    out << to_json();
    if (!out.flush())
      return caf::make_error(caf::sec::runtime_error,
                             "--trace: write to " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return caf::make_error(caf::sec::runtime_error,
                           "--trace: cannot rename " + tmp + " to " + path);
  return caf::none;
}

} // namespace dualpath::actors::observe
