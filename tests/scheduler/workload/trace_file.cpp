// ctest-label: run
// The JSON-lines trace format: writer, validating loader, round trip.
#include "scheduler/workload/trace_file.hpp"

#include <sstream>
#include <string>

#include <doctest/doctest.h>

#include "scheduler/workload/errors.hpp"
#include "scheduler/workload/generator.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::scheduler::workload;

namespace {

caf::expected<trace> parse(const std::string& text, uint64_t max_len = 0) {
  std::istringstream in{text};
  return parse_trace(in, max_len, "t.jsonl");
}

const std::string example =
    R"({"agent": 0, "seed": 1, "turns": [{"append": 6120, "gen": 211}, {"append": 312, "gen": 95}]}
{"agent": 7, "seed": 1, "turns": [{"append": 418, "gen": 130}, {"append": 6120, "gen": 211}, {"append": 312, "gen": 95}], "history": 1, "source": {"agent": 0, "offset": 548}}
)";

const char* ok_line = R"({"agent": 0, "turns": [{"append": 5, "gen": 2}]})";

} // namespace

TEST_CASE("the documented example parses and is written back verbatim") {
  auto xs = parse(example, 65536);
  REQUIRE(xs);
  std::ostringstream os;
  write_trace(os, *xs);
  CHECK(os.str() == example);
  auto ys = xs;
  REQUIRE(ys);
  REQUIRE(ys->size() == 2);
  CHECK((*ys)[0].turns[1] == turn{312, 95});
  CHECK((*ys)[1].history_turns == 1);
  CHECK((*ys)[1].source_agent == 0);
  CHECK((*ys)[1].source_offset == 548);
  // The clone's turn 1 prompt ends with the source's turn 0 prompt.
  auto src = prompt_tokens((*ys)[0], 0);
  auto cl = prompt_tokens((*ys)[1], 1);
  REQUIRE(cl.size() == 548 + src.size());
  CHECK(std::equal(src.begin(), src.end(), cl.begin() + 548));
}

TEST_CASE("writer -> loader round trip") {
  auto p = preset("trace-64k");
  REQUIRE(p);
  p->agents = 40;
  auto xs = generate(*p);
  REQUIRE(xs);
  auto more = add_agents(*xs, 60, 4, p->max_len);
  REQUIRE(more);
  auto win = limit_turns(*more, 3, 20);
  REQUIRE(win);
  dualpath::test::temp_dir dir;
  for (auto* t : {&*more, &*win}) {
    auto path = dir.file("trace.jsonl");
    REQUIRE(!save_trace(path, *t));
    auto back = load_trace(path, p->max_len);
    REQUIRE(back);
    CHECK(*back == *t);
    auto& last = back->back();
    CHECK(prompt_tokens(last, last.turns.size() - 1)
          == prompt_tokens(t->back(), t->back().turns.size() - 1));
  }
  std::ostringstream os;
  write_trace(os, {trajectory{3, 1, {{5, 2}}, 0, 0, 0}});
  CHECK(os.str()
        == "{\"agent\": 3, \"seed\": 1, \"turns\": [{\"append\": 5, "
           "\"gen\": 2}]}\n");
  auto bad = save_trace(dir.file("no/such/dir/x.jsonl"), *xs);
  CHECK(bad == workload_errc::io_error);
}

TEST_CASE("every malformed trace is rejected naming the line and the field") {
  struct bad_case {
    std::string what;
    std::string text;
    uint64_t max_len;
    workload_errc code;
    const char* where; // expected in the message
    const char* field; // expected in the message ("" for none)
  };
  std::string ok = ok_line;
  std::vector<bad_case> cases = {
      {"truncated JSON", ok + "\n{\"agent\": 1, \"turns\": [", 0,
       workload_errc::bad_json, "line 2", ""},
      {"not an object",
       ok + "\n" + R"({"agent": 1, "turns": [{"append": 5, "gen": 2}]})"
           + "\n[1, 2]",
       0, workload_errc::bad_json, "line 3", ""},
      {"missing agent", R"({"turns": [{"append": 5, "gen": 2}]})", 0,
       workload_errc::missing_field, "line 1", "'agent'"},
      {"missing turns", ok + "\n\n" + R"({"agent": 4})", 0,
       workload_errc::missing_field, "line 3", "'turns'"},
      {"missing gen",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}, {"append": 5}]})", 0,
       workload_errc::missing_field, "line 1", "'turns[1].gen'"},
      {"extra field", ok + "\n" + R"({"agent": 1, "turns": [], "foo": 1})", 0,
       workload_errc::unknown_field, "line 2", "'foo'"},
      {"extra turn field",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2, "tool": "x"}]})", 0,
       workload_errc::unknown_field, "line 1", "'turns[0].tool'"},
      {"extra source field",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}], "source": {"agent": 0, "offset": 2, "x": 0}})",
       0, workload_errc::unknown_field, "line 1", "'source.x'"},
      {"agent as string",
       R"({"agent": "a1", "turns": [{"append": 5, "gen": 2}]})", 0,
       workload_errc::wrong_type, "line 1", "'agent'"},
      {"turns as object", R"({"agent": 1, "turns": {"append": 5}})", 0,
       workload_errc::wrong_type, "line 1", "'turns'"},
      {"turn as number", R"({"agent": 1, "turns": [7]})", 0,
       workload_errc::wrong_type, "line 1", "'turns[0]'"},
      {"fractional append",
       R"({"agent": 1, "turns": [{"append": 1.5, "gen": 2}]})", 0,
       workload_errc::wrong_type, "line 1", "'turns[0].append'"},
      {"source as number",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}], "source": 3})", 0,
       workload_errc::wrong_type, "line 1", "'source'"},
      {"zero append",
       ok + "\n" + R"({"agent": 1, "turns": [{"append": 0, "gen": 2}]})", 0,
       workload_errc::bad_length, "line 2", "'turns[0].append'"},
      {"negative gen",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}, {"append": 5, "gen": -3}]})",
       0, workload_errc::bad_length, "line 1", "'turns[1].gen'"},
      {"negative agent", R"({"agent": -1, "turns": [{"append": 5, "gen": 2}]})",
       0, workload_errc::bad_length, "line 1", "'agent'"},
      {"append above 32 bits",
       R"({"agent": 1, "turns": [{"append": 4294967296, "gen": 2}]})", 0,
       workload_errc::bad_length, "line 1", "'turns[0].append'"},
      {"no turns", R"({"agent": 1, "turns": []})", 0, workload_errc::bad_length,
       "line 1", "'turns'"},
      {"history covers every turn",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}], "history": 1})", 0,
       workload_errc::bad_length, "line 1", "'history'"},
      {"source offset beyond the trajectory",
       R"({"agent": 1, "turns": [{"append": 5, "gen": 2}], "source": {"agent": 0, "offset": 8}})",
       0, workload_errc::bad_length, "line 1", "'source.offset'"},
      {"context above max_len",
       ok + "\n"
           + R"({"agent": 1, "turns": [{"append": 50, "gen": 20}, {"append": 25, "gen": 6}]})",
       100, workload_errc::too_long, "line 2", "'turns[1]'"},
      {"duplicate agent",
       ok + "\n" + R"({"agent": 1, "turns": [{"append": 5, "gen": 2}]})" + "\n"
           + ok,
       0, workload_errc::duplicate_agent, "line 3",
       "already defined on line 1"},
      {"empty file", "", 0, workload_errc::empty_trace, "t.jsonl", "no record"},
      {"blank lines only", "\n  \n\t\n", 0, workload_errc::empty_trace,
       "t.jsonl", "no record in 3 lines"},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    auto xs = parse(c.text, c.max_len);
    REQUIRE(!xs);
    CHECK(xs.error() == c.code);
    auto msg = message_of(xs.error());
    CAPTURE(msg);
    CHECK(msg.rfind("t.jsonl", 0) == 0);
    CHECK(msg.find(c.where) != std::string::npos);
    CHECK(msg.find(c.field) != std::string::npos);
  }
  // The same record within max_len is fine.
  CHECK(parse(
      ok + "\n"
          + R"({"agent": 1, "turns": [{"append": 50, "gen": 20}, {"append": 25, "gen": 5}]})",
      100));
}

TEST_CASE("a missing file is an io_error naming the path") {
  auto xs = load_trace("/nonexistent/dir/trace.jsonl", 0);
  REQUIRE(!xs);
  CHECK(xs.error() == workload_errc::io_error);
  CHECK(message_of(xs.error()).find("/nonexistent/dir/trace.jsonl")
        != std::string::npos);
}
