#include "scheduler/workload/trace_file.hpp"

#include <fstream>
#include <initializer_list>
#include <istream>
#include <map>
#include <ostream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "scheduler/workload/errors.hpp"

namespace dualpath::scheduler::workload {

namespace {

using json = nlohmann::json;

std::string type_name(const json& j) {
  if (j.is_number_unsigned() || j.is_number_integer())
    return "integer";
  return j.type_name();
}

// Validates one record; every error names the file, the line and the field.
class record_reader {
public:
  record_reader(const std::string& name, size_t line)
      : prefix_(name + " line " + std::to_string(line) + ": ") {
  }

  caf::error fail(workload_errc code, std::string_view field,
                  const std::string& what) const {
    return caf::make_error(code, prefix_ + "field '" + std::string{field}
                                     + "': " + what);
  }

  caf::error fail(workload_errc code, const std::string& what) const {
    return caf::make_error(code, prefix_ + what);
  }

  /// Fails when `obj` holds a key outside `allowed`.
  caf::error only(const json& obj, std::string_view where,
                  std::initializer_list<std::string_view> allowed) const {
    for (auto& [key, value] : obj.items()) {
      bool known = false;
      for (auto a : allowed)
        known = known || key == a;
      if (!known) {
        auto field = where.empty() ? key : std::string{where} + "." + key;
        return fail(workload_errc::unknown_field, field,
                    "unknown field (allowed: " + list(allowed) + ")");
      }
    }
    return caf::none;
  }

  /// Reads the unsigned integer `obj[key]` into `out`, requiring
  /// lo <= value <= hi. Absent keys fail only when `required`.
  caf::error uint(const json& obj, const char* key, std::string_view field,
                  bool required, uint64_t lo, uint64_t hi,
                  uint64_t& out) const {
    auto i = obj.find(key);
    if (i == obj.end()) {
      if (required)
        return fail(workload_errc::missing_field, field, "missing");
      return caf::none;
    }
    if (i->is_number_integer() && !i->is_number_unsigned())
      return fail(workload_errc::bad_length, field,
                  "must be >= " + std::to_string(lo) + ", got "
                      + std::to_string(i->get<int64_t>()));
    if (!i->is_number_unsigned())
      return fail(workload_errc::wrong_type, field,
                  "expected a non-negative integer, got " + type_name(*i));
    auto v = i->get<uint64_t>();
    if (v < lo || v > hi)
      return fail(workload_errc::bad_length, field,
                  "must be in [" + std::to_string(lo) + ", "
                      + std::to_string(hi) + "], got " + std::to_string(v));
    out = v;
    return caf::none;
  }

private:
  static std::string list(std::initializer_list<std::string_view> xs) {
    std::string out;
    for (auto x : xs) {
      if (!out.empty())
        out += ", ";
      out += x;
    }
    return out;
  }

  std::string prefix_;
};

caf::expected<trajectory> read_record(const record_reader& r, const json& j,
                                      uint64_t max_len) {
  if (!j.is_object())
    return r.fail(workload_errc::bad_json,
                  "a record must be a JSON object, got " + type_name(j));
  if (auto err = r.only(j, "", {"agent", "seed", "turns", "history", "source"}))
    return err;
  trajectory t;
  if (auto err = r.uint(j, "agent", "agent", true, 0, UINT64_MAX, t.agent))
    return err;
  if (auto err = r.uint(j, "seed", "seed", false, 0, UINT64_MAX, t.seed))
    return err;
  auto turns = j.find("turns");
  if (turns == j.end())
    return r.fail(workload_errc::missing_field, "turns", "missing");
  if (!turns->is_array())
    return r.fail(workload_errc::wrong_type, "turns",
                  "expected an array, got " + type_name(*turns));
  if (turns->empty())
    return r.fail(workload_errc::bad_length, "turns",
                  "a trajectory needs at least one turn");
  uint64_t len = 0;
  for (size_t k = 0; k < turns->size(); ++k) {
    auto& x = (*turns)[k];
    auto field = "turns[" + std::to_string(k) + "]";
    if (!x.is_object())
      return r.fail(workload_errc::wrong_type, field,
                    "expected an object {\"append\", \"gen\"}, got "
                        + type_name(x));
    if (auto err = r.only(x, field, {"append", "gen"}))
      return err;
    uint64_t append = 0;
    uint64_t gen = 0;
    if (auto err =
            r.uint(x, "append", field + ".append", true, 1, UINT32_MAX, append))
      return err;
    if (auto err = r.uint(x, "gen", field + ".gen", true, 1, UINT32_MAX, gen))
      return err;
    len += append + gen;
    if (max_len > 0 && len > max_len)
      return r.fail(workload_errc::too_long, field,
                    "context reaches " + std::to_string(len)
                        + " tokens after this turn, above max_len "
                        + std::to_string(max_len));
    t.turns.push_back(
        turn{static_cast<uint32_t>(append), static_cast<uint32_t>(gen)});
  }
  uint64_t history = 0;
  if (auto err = r.uint(j, "history", "history", false, 0, t.turns.size() - 1,
                        history))
    return err;
  t.history_turns = static_cast<uint32_t>(history);
  auto src = j.find("source");
  if (src != j.end()) {
    if (!src->is_object())
      return r.fail(workload_errc::wrong_type, "source",
                    "expected an object {\"agent\", \"offset\"}, got "
                        + type_name(*src));
    if (auto err = r.only(*src, "source", {"agent", "offset"}))
      return err;
    if (auto err = r.uint(*src, "agent", "source.agent", true, 0, UINT64_MAX,
                          t.source_agent))
      return err;
    if (auto err = r.uint(*src, "offset", "source.offset", true, 1, len,
                          t.source_offset))
      return err;
  }
  return t;
}

} // namespace

void write_trace(std::ostream& out, const trace& xs) {
  for (auto& x : xs) {
    out << "{\"agent\": " << x.agent << ", \"seed\": " << x.seed
        << ", \"turns\": [";
    for (size_t k = 0; k < x.turns.size(); ++k) {
      if (k > 0)
        out << ", ";
      out << "{\"append\": " << x.turns[k].append
          << ", \"gen\": " << x.turns[k].gen << "}";
    }
    out << "]";
    if (x.history_turns > 0)
      out << ", \"history\": " << x.history_turns;
    if (x.source_offset > 0)
      out << ", \"source\": {\"agent\": " << x.source_agent
          << ", \"offset\": " << x.source_offset << "}";
    out << "}\n";
  }
}

caf::error save_trace(const std::string& path, const trace& xs) {
  std::ofstream out{path, std::ios::trunc};
  if (!out)
    return caf::make_error(workload_errc::io_error,
                           path + ": cannot open for writing");
  write_trace(out, xs);
  out.flush();
  if (!out)
    return caf::make_error(workload_errc::io_error, path + ": write failed");
  return caf::none;
}

caf::expected<trace> parse_trace(std::istream& in, uint64_t max_len,
                                 const std::string& name) {
  trace out;
  std::map<uint64_t, size_t> first_line; // agent id -> line defining it
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    record_reader r{name, line_no};
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      // nlohmann reports by exception; it stops here and becomes a value.
      return r.fail(workload_errc::bad_json,
                    std::string{"not valid JSON: "} + e.what());
    }
    auto t = read_record(r, j, max_len);
    if (!t)
      return t.error();
    auto [it, fresh] = first_line.emplace(t->agent, line_no);
    if (!fresh)
      return r.fail(workload_errc::duplicate_agent, "agent",
                    "agent " + std::to_string(t->agent)
                        + " is already defined on line "
                        + std::to_string(it->second));
    out.push_back(std::move(*t));
  }
  if (in.bad())
    return caf::make_error(workload_errc::io_error, name + ": read failed");
  if (out.empty())
    return caf::make_error(workload_errc::empty_trace,
                           name + ": empty trace: no record in "
                               + std::to_string(line_no) + " lines");
  return out;
}

caf::expected<trace> load_trace(const std::string& path, uint64_t max_len) {
  std::ifstream in{path};
  if (!in)
    return caf::make_error(workload_errc::io_error,
                           path + ": cannot open for reading");
  return parse_trace(in, max_len, path);
}

} // namespace dualpath::scheduler::workload
