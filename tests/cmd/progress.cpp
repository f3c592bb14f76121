// ctest-label: sim
// The progress line of `dualpath sim` and `dualpath run` as real processes:
// on a terminal (a pseudo-terminal here) one line rewritten in place with the
// mode, requests done/total, emulated time and an ETA, store population
// included; into a file, plain lines with no carriage return; --quiet, none.
#include <doctest/doctest.h>

#include <algorithm>

#include <fcntl.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;

namespace {

// Runs `argv` with stderr on a pseudo-terminal (stdout to /dev/null);
// returns what the terminal showed.
std::string run_on_terminal(const std::vector<std::string>& argv) {
  int master = -1;
  int slave = -1;
  REQUIRE(openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  auto pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(master);
    int null_fd = ::open("/dev/null", O_RDWR);
    dup2(null_fd, 0);
    dup2(null_fd, 1);
    dup2(slave, 2);
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  ::close(slave);
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ::read(master, buf, sizeof(buf));
    if (n <= 0)
      break; // EIO once the child closed its end
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return out;
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
