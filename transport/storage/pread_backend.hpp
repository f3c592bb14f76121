// Storage backend on a thread pool doing blocking pread(2): the fallback when
// io_uring cannot be set up. `queue_depth` worker threads give the same number
// of reads in flight as an io_uring of that depth.
//
// Thread safety: all calls are thread-safe; concurrent read() calls share the
// workers. Ownership: owns its threads (joined in the destructor).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/storage/backend.hpp"
#include "transport/storage/worker_pool.hpp"

namespace dualpath::transport::storage {

class pread_backend final : public posix_file_backend {
public:
  static std::unique_ptr<pread_backend> make(uint32_t queue_depth);

  ~pread_backend() override;

  std::vector<read_result> read(const std::vector<read_op>& ops,
                                io_mode mode) override;

private:
  explicit pread_backend(uint32_t depth);

  worker_pool workers_;
};

} // namespace dualpath::transport::storage
