#include "transport/storage/pread_backend.hpp"

#include <atomic>
#include <cerrno>

#include <unistd.h>

#include "transport/storage/syscall.hpp"

namespace dualpath::transport::storage {

namespace {

read_result read_one(const read_op& op, io_mode mode) {
  auto fd = posix_open_read(op.path, mode);
  if (!fd)
    return std::move(fd.error());
  caf::error err;
  size_t done = 0;
  while (done < op.length) {
    auto n = sys_call("pread", op.path,
                      ::pread(*fd, op.buffer + done, op.length - done,
                              static_cast<off_t>(op.offset + done)),
                      err);
    if (n < 0) {
      if (errno != EINTR)
        break;
      err = caf::error{};
      continue;
    }
    if (n == 0)
      break;
    done += static_cast<size_t>(n);
    // As with io_uring: a short O_DIRECT read is the end of the file.
    if (mode == io_mode::direct)
      break;
  }
  ::close(*fd);
  if (err)
    return err;
  return done;
}

} // namespace

std::unique_ptr<pread_backend> pread_backend::make(uint32_t queue_depth) {
  return std::unique_ptr<pread_backend>{
      new pread_backend(queue_depth == 0 ? 1 : queue_depth)};
}

pread_backend::pread_backend(uint32_t depth)
    : posix_file_backend("pread", depth), workers_(depth) {
}

pread_backend::~pread_backend() {
  // nop (the pool joins its threads)
}

std::vector<read_result> pread_backend::read(const std::vector<read_op>& ops,
                                             io_mode mode) {
  std::vector<read_result> results(ops.size(), read_result{size_t{0}});
  if (ops.empty())
    return results;
  // Each of up to queue_depth() tasks pulls the next op until all are taken;
  // the caller waits until the last task has finished.
  std::atomic<size_t> next{0};
  std::mutex done_mtx;
  std::condition_variable done_cv;
  size_t tasks = std::min<size_t>(queue_depth(), ops.size());
  size_t running = tasks;
  auto task = [&] {
    for (size_t i = next++; i < ops.size(); i = next++)
      results[i] = read_one(ops[i], mode);
    std::lock_guard<std::mutex> guard{done_mtx};
    if (--running == 0)
      done_cv.notify_all();
  };
  for (size_t i = 0; i < tasks; ++i)
    workers_.post(task);
  std::unique_lock<std::mutex> lock{done_mtx};
  done_cv.wait(lock, [&] { return running == 0; });
  return results;
}

} // namespace dualpath::transport::storage
