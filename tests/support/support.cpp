#include "tests/support/support.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include <fcntl.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dualpath::test {

temp_dir::temp_dir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr)
    throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string temp_dir::file(const std::string& name) const {
  return path_ + "/" + name;
}

void skip_suite(const std::string& suite, const std::string& reason) {
  std::cout << "SKIP " << suite << ": " << reason << std::endl;
  std::exit(77);
}

namespace {

std::string slurp(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ::read(fd, buf, sizeof(buf));
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// In a forked child: stdin from /dev/null, stdout and stderr to the given
// descriptors, then exec `argv` (exit 127 when that fails).
[[noreturn]] void exec_child(const std::vector<std::string>& argv, int out_fd,
                             int err_fd) {
  int null_fd = ::open("/dev/null", O_RDONLY);
  dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

int exit_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace

process_result run_on_terminal(const std::vector<std::string>& argv) {
  int master = -1;
  int slave = -1;
  if (openpty(&master, &slave, nullptr, nullptr, nullptr) != 0)
    throw std::runtime_error("openpty failed");
  int null_fd = ::open("/dev/null", O_WRONLY);
  auto pid = fork();
  if (pid < 0)
    throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(master);
    exec_child(argv, null_fd, slave);
  }
  ::close(slave);
  ::close(null_fd);
  process_result res;
  // Until EIO: the child closed its end.
  res.err = slurp(master);
  ::close(master);
  res.status = exit_status(pid);
  return res;
}

process_result run_process(const std::vector<std::string>& argv) {
  // stdout and stderr go to temporary files so that neither pipe can fill up
  // and block the child.
  char out_tmpl[] = "/tmp/dualpath-out-XXXXXX";
  char err_tmpl[] = "/tmp/dualpath-err-XXXXXX";
  int out_fd = mkstemp(out_tmpl);
  int err_fd = mkstemp(err_tmpl);
  if (out_fd < 0 || err_fd < 0)
    throw std::runtime_error("mkstemp failed");
  unlink(out_tmpl);
  unlink(err_tmpl);
  auto pid = fork();
  if (pid < 0)
    throw std::runtime_error("fork failed");
  if (pid == 0)
    exec_child(argv, out_fd, err_fd);
  process_result res;
  res.status = exit_status(pid);
  lseek(out_fd, 0, SEEK_SET);
  lseek(err_fd, 0, SEEK_SET);
  res.out = slurp(out_fd);
  res.err = slurp(err_fd);
  close(out_fd);
  close(err_fd);
  return res;
}

std::string dualpath_binary() {
  return std::string(DUALPATH_BINARY_DIR) + "/bin/dualpath";
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out{path, std::ios::binary | std::ios::trunc};
  out << content;
  if (!out)
    throw std::runtime_error("cannot write " + path);
}

void run_until(caf::scheduler::test_coordinator& sched,
               const std::function<bool()>& done, int max_timers) {
  for (int i = 0; i < max_timers && !done(); ++i) {
    sched.run();
    if (done() || !sched.trigger_timeout())
      break;
  }
  sched.run();
}

} // namespace dualpath::test
