// Storage backend on io_uring (liburing): reads of one call are submitted to a
// ring and kept `queue_depth` deep; O_DIRECT is honoured per call. Writes,
// listings and directory creation use the POSIX helpers (they are rare and
// off the read path).
//
// Thread safety: all calls are thread-safe. A ring is not, so each read() call
// takes a ring of its own from a small free list (growing to the number of
// threads reading at once), and concurrent callers do not serialise.
// Ownership: owns its rings (torn down in the destructor; no read() may be
// running then).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "transport/storage/backend.hpp"

struct io_uring;

namespace dualpath::transport::storage {

class io_uring_backend final : public posix_file_backend {
public:
  /// Sets up a ring of `queue_depth` entries; backend_unavailable if the
  /// kernel refuses (ENOSYS, EPERM, ...).
  static caf::expected<std::unique_ptr<io_uring_backend>>
  make(uint32_t queue_depth);

  ~io_uring_backend() override;

  std::vector<read_result> read(const std::vector<read_op>& ops,
                                io_mode mode) override;

private:
  struct ring_deleter {
    void operator()(io_uring* ring) const;
  };
  using ring_ptr = std::unique_ptr<io_uring, ring_deleter>;

  io_uring_backend(ring_ptr ring, uint32_t depth);

  static caf::expected<ring_ptr> make_ring(uint32_t depth);

  std::mutex mtx_;
  std::vector<ring_ptr> free_rings_;
};

} // namespace dualpath::transport::storage
