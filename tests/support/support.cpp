#include "tests/support/support.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
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

// -- background_process -------------------------------------------------------

namespace {

int decode_status(int st) {
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return 255;
}

std::string slurp(const std::string& path) {
  std::ifstream in{path};
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

} // namespace

background_process::background_process(const std::vector<std::string>& argv,
                                       const std::string& out_file,
                                       const std::string& err_file)
    : out_(out_file), err_(err_file) {
  pid_ = ::fork();
  if (pid_ == 0) {
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

background_process::~background_process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

bool background_process::running() {
  if (pid_ <= 0 || status_ >= 0)
    return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = decode_status(st);
    return false;
  }
  return true;
}

void background_process::signal(int sig) {
  if (running())
    ::kill(pid_, sig);
}

int background_process::wait() {
  if (status_ >= 0 || pid_ <= 0)
    return status_;
  int st = 0;
  ::waitpid(pid_, &st, 0);
  status_ = decode_status(st);
  return status_;
}

int background_process::wait_for(std::chrono::seconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (running())
    ::kill(pid_, SIGKILL);
  return wait();
}

std::string background_process::out() const {
  return slurp(out_);
}

std::string background_process::err() const {
  return slurp(err_);
}

bool background_process::wait_err(const std::string& text,
                                  std::chrono::seconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (err().find(text) != std::string::npos)
      return true;
    if (!running())
      return err().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// -- loopback sockets ---------------------------------------------------------

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string read_to_end(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0)
      break;
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

} // namespace dualpath::test
