// ctest-label: sim
// The progress line of `dualpath sim` and `dualpath run` as real processes:
// on a terminal (a pseudo-terminal here) one line rewritten in place with the
// mode, requests done/total, emulated time and an ETA, store population
// included; into a file, plain lines with no carriage return; --quiet, none.
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;

namespace {

// What the terminal showed of a run that must succeed.
std::string run_on_terminal(const std::vector<std::string>& argv) {
  auto res = dualpath::test::run_on_terminal(argv);
  CHECK(res.status == 0);
  return res.err;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> sim(std::vector<std::string> extra) {
  std::vector<std::string> args{
      dualpath_binary(), "sim", "--agents", "1500",
      "--turns",         "2",   "--mode",   "basic,dualpath"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

} // namespace

TEST_CASE("on a terminal: one line per mode and phase, updated in place") {
  auto shown = run_on_terminal(sim({}));
  CAPTURE(shown);
  // Every update returns to the line's start and clears it; a line ends
  // only when its phase of its mode is done.
  CHECK(has(shown, "\r\033[K[sim basic] populating the store: agents "));
  CHECK(has(shown, "\r\033[K[sim basic] requests "));
  CHECK(has(shown, "[sim basic] requests 3000/3000, emulated "));
  CHECK(has(shown, "[sim dualpath] requests 3000/3000, emulated "));
  // The terminal turns "\n" into "\r\n".
  auto lines = std::count(shown.begin(), shown.end(), '\n');
  CHECK(lines == 4); // populate and replay, two modes
  auto updates = std::count(shown.begin(), shown.end(), '\033');
  CHECK(updates >= 4);
  // Emulated time and, once there is a rate to go by, an ETA or the time
  // it took.
  CHECK(has(shown, " s, done in "));
}

TEST_CASE("into a file: plain periodic lines; --quiet: none") {
  auto res = run_process(sim({}));
  REQUIRE_MESSAGE(res.status == 0, res.err);
  CHECK(!has(res.err, "\r"));
  CHECK(!has(res.err, "\033"));
  CHECK(has(res.err, "[sim basic] populating the store: agents 150/1500\n"));
  CHECK(has(res.err, "[sim basic] populating the store: agents 1500/1500, "
                     "done in "));
  CHECK(has(res.err, "[sim basic] requests 256/3000, emulated "));
  CHECK(has(res.err, "[sim dualpath] requests 3000/3000, emulated "));
  auto lines = std::count(res.err.begin(), res.err.end(), '\n');
  CHECK(lines >= 4);
  CHECK(lines <= 2 * (10 + 21));
  auto quiet = run_process(sim({"--quiet"}));
  REQUIRE(quiet.status == 0);
  CHECK(quiet.err.empty());
}
