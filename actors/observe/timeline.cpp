#include "actors/observe/timeline.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace dualpath::actors::observe {

namespace {

void write_string(std::ostringstream& out, const std::string& x) {
  out << '"';
  for (auto c : x) {
    switch (c) {
      case '"':
        out << "\\\"";
        break;
      case '\\':
        out << "\\\\";
        break;
      case '\n':
        out << "\\n";
        break;
      case '\t':
        out << "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out << buf;
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

// Microseconds with nanosecond precision.
std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld.%03lld",
                static_cast<long long>(ns / 1000),
                static_cast<long long>((ns < 0 ? -ns : ns) % 1000));
  return buf;
}

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
  std::ostringstream out;
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":"
         "\"emulated time since the cluster's start\"},\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first)
      out << ",\n";
    first = false;
  };
  for (size_t p = 0; p < nodes.size(); ++p) {
    auto pid = p + 1;
    sep();
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
        << ",\"tid\":0,\"args\":{\"name\":";
    write_string(out, nodes[p]);
    out << "}}";
    sep();
    out << "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << pid
        << ",\"tid\":0,\"args\":{\"sort_index\":" << pid << "}}";
    uint32_t tid = 1;
    for (auto& track : tracks[nodes[p]]) {
      auto placed = assign_lanes(by_track[{nodes[p], track}]);
      uint32_t lanes = 0;
      for (auto& x : placed)
        lanes = std::max(lanes, x.lane + 1);
      for (uint32_t l = 0; l < lanes; ++l) {
        sep();
        auto name = l == 0 ? track : track + " #" + std::to_string(l + 1);
        out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid
            << ",\"tid\":" << tid + l << ",\"args\":{\"name\":";
        write_string(out, name);
        out << "}}";
        sep();
        out << "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" << pid
            << ",\"tid\":" << tid + l << ",\"args\":{\"sort_index\":" << tid + l
            << "}}";
      }
      for (auto& x : placed) {
        auto& s = x.span;
        sep();
        out << "{\"name\":";
        write_string(out, s.name);
        out << ",\"cat\":";
        write_string(out, s.name);
        out << ",\"ph\":\"X\",\"ts\":" << micros(s.begin_ns) << ",\"dur\":"
            << micros(std::max<int64_t>(0, s.end_ns - s.begin_ns))
            << ",\"pid\":" << pid << ",\"tid\":" << tid + x.lane
            << ",\"args\":{\"request\":" << s.request_id;
        if (s.layer >= 0)
          out << ",\"layer\":" << s.layer;
        if (s.bytes > 0)
          out << ",\"bytes\":" << s.bytes;
        out << "}}";
      }
      tid += std::max<uint32_t>(lanes, 1);
    }
  }
  out << "]}\n";
  return out.str();
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
