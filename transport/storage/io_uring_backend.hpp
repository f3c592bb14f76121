// Storage backend on io_uring (liburing): reads of one call are submitted to a
// ring and kept `queue_depth` deep; O_DIRECT is honoured per call. Writes,
// listings and directory creation use the POSIX helpers (they are rare and
// off the read path).
//
// Thread safety: read() serialises callers on the ring with a mutex (one ring
// per backend); the other calls are thread-safe. Ownership: owns the ring
// (torn down in the destructor, after the last read returned).
#pragma once

#include <memory>
#include <mutex>

#include "transport/storage/backend.hpp"

struct io_uring;

namespace dualpath::transport::storage {

class io_uring_backend final : public storage_backend {
public:
  /// Sets up a ring of `queue_depth` entries; backend_unavailable if the
  /// kernel refuses (ENOSYS, EPERM, ...).
  static caf::expected<std::unique_ptr<io_uring_backend>>
  make(uint32_t queue_depth);

  ~io_uring_backend() override;

  std::string name() const override;
  uint32_t queue_depth() const override;
  std::vector<read_result> read(const std::vector<read_op>& ops,
                                io_mode mode) override;
  caf::error write_atomic(const std::string& path, const std::byte* data,
                          size_t len, durability sync) override;
  caf::expected<std::vector<std::string>> list(const std::string& dir) override;
  caf::error make_dir(const std::string& dir) override;

private:
  io_uring_backend(std::unique_ptr<io_uring> ring, uint32_t depth);

  std::mutex mtx_;
  std::unique_ptr<io_uring> ring_;
  uint32_t depth_;
};

} // namespace dualpath::transport::storage
