#include "transport/storage/io_uring_backend.hpp"

#include <cerrno>
#include <deque>

#include <liburing.h>
#include <unistd.h>

#include "transport/storage/syscall.hpp"

namespace dualpath::transport::storage {

void io_uring_backend::ring_deleter::operator()(io_uring* ring) const {
  ::io_uring_queue_exit(ring);
  delete ring;
}

caf::expected<io_uring_backend::ring_ptr>
io_uring_backend::make_ring(uint32_t depth) {
  auto ring = std::make_unique<io_uring>();
  caf::error err;
  if (uring_call("io_uring_queue_init", std::to_string(depth),
                 ::io_uring_queue_init(depth, ring.get(), 0), err)
      < 0)
    return caf::make_error(storage_errc::backend_unavailable,
                           caf::to_string(err));
  return ring_ptr{ring.release()};
}

caf::expected<std::unique_ptr<io_uring_backend>>
io_uring_backend::make(uint32_t queue_depth) {
  if (queue_depth == 0)
    queue_depth = 1;
  // The first ring doubles as the probe: if it cannot be set up, the
  // automatic selection falls back to pread.
  auto ring = make_ring(queue_depth);
  if (!ring)
    return std::move(ring.error());
  return std::unique_ptr<io_uring_backend>{
      new io_uring_backend(std::move(*ring), queue_depth)};
}

io_uring_backend::io_uring_backend(ring_ptr ring, uint32_t depth)
    : posix_file_backend("io_uring", depth) {
  free_rings_.push_back(std::move(ring));
}

io_uring_backend::~io_uring_backend() {
  // nop (rings are torn down by their deleters)
}

std::vector<read_result> io_uring_backend::read(const std::vector<read_op>& ops,
                                                io_mode mode) {
  // Per-op progress: the fd, bytes done so far and the first error.
  struct state {
    int fd = -1;
    size_t done = 0;
    caf::error err;
    bool finished = false;
  };
  std::vector<state> st(ops.size());
  // Take a ring for this call (a new one if every ring is in use).
  ring_ptr owned;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (!free_rings_.empty()) {
      owned = std::move(free_rings_.back());
      free_rings_.pop_back();
    }
  }
  if (!owned) {
    auto fresh = make_ring(queue_depth());
    if (!fresh)
      return std::vector<read_result>(ops.size(), read_result{fresh.error()});
    owned = std::move(*fresh);
  }
  auto* ring = owned.get();
  bool ring_ok = true; // false after a failed submit/wait: never reuse it
  size_t next = 0;     // next op to start
  uint32_t inflight = 0;
  std::deque<size_t> resubmit; // ops with a short buffered read to continue
  auto finish = [&](size_t i) {
    st[i].finished = true;
    if (st[i].fd >= 0) {
      ::close(st[i].fd);
      st[i].fd = -1;
    }
  };
  auto prep = [&](size_t i) {
    auto* sqe = ::io_uring_get_sqe(ring);
    auto& op = ops[i];
    ::io_uring_prep_read(sqe, st[i].fd, op.buffer + st[i].done,
                         static_cast<unsigned>(op.length - st[i].done),
                         op.offset + st[i].done);
    ::io_uring_sqe_set_data64(sqe, i);
    ++inflight;
  };
  // The ring is unusable for these SQEs: fail everything unfinished.
  auto fail_unfinished = [&](const caf::error& err) {
    ring_ok = false;
    for (size_t i = 0; i < ops.size(); ++i)
      if (!st[i].finished) {
        st[i].err = err;
        finish(i);
      }
  };
  for (;;) {
    // Fill the ring up to its depth: continuations first, then new ops.
    uint32_t prepared = 0;
    while (inflight < queue_depth() && !resubmit.empty()) {
      prep(resubmit.front());
      resubmit.pop_front();
      ++prepared;
    }
    while (inflight < queue_depth() && next < ops.size()) {
      auto i = next++;
      auto fd = posix_open_read(ops[i].path, mode);
      if (!fd) {
        st[i].err = std::move(fd.error());
        finish(i);
        continue;
      }
      st[i].fd = *fd;
      if (ops[i].length == 0) {
        finish(i);
        continue;
      }
      prep(i);
      ++prepared;
    }
    if (inflight == 0)
      break;
    caf::error err;
    if (prepared > 0) {
      int rc;
      do {
        rc = ::io_uring_submit(ring);
      } while (rc == -EINTR);
      if (uring_call("io_uring_submit", "", rc, err) < 0) {
        fail_unfinished(err);
        break;
      }
    }
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = ::io_uring_wait_cqe(ring, &cqe);
    } while (rc == -EINTR);
    if (uring_call("io_uring_wait_cqe", "", rc, err) < 0) {
      fail_unfinished(err);
      break;
    }
    auto i = static_cast<size_t>(::io_uring_cqe_get_data64(cqe));
    auto res = cqe->res;
    ::io_uring_cqe_seen(ring, cqe);
    --inflight;
    if (res == -EINTR || res == -EAGAIN) {
      resubmit.push_back(i);
    } else if (res < 0) {
      uring_call("read", ops[i].path, res, st[i].err);
      finish(i);
    } else {
      st[i].done += static_cast<size_t>(res);
      // A short O_DIRECT read means end of file (continuing would be an
      // unaligned read); a short buffered read may be a partial transfer, so
      // it continues until a read returns 0.
      if (res == 0 || st[i].done == ops[i].length || mode == io_mode::direct)
        finish(i);
      else
        resubmit.push_back(i);
    }
  }
  if (ring_ok) {
    std::lock_guard<std::mutex> guard{mtx_};
    free_rings_.push_back(std::move(owned));
  }
  std::vector<read_result> results;
  results.reserve(ops.size());
  for (auto& s : st) {
    if (s.err)
      results.emplace_back(std::move(s.err));
    else
      results.emplace_back(s.done);
  }
  return results;
}

} // namespace dualpath::transport::storage
