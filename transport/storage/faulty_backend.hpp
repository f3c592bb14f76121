// A fault-injecting decorator around any storage_backend (like LevelDB's
// EnvWrapper-based fault injection): it forwards every call and applies a
// deterministic fault_plan, so every bad-input case of the block store can be
// driven in tests without damaging real disks.
//
// Thread safety: all calls are thread-safe; set_plan() may be called while
// other threads use the backend (later calls see the new plan).
// Ownership: shares the wrapped backend.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "transport/storage/backend.hpp"

namespace dualpath::transport::storage {

/// What to inject. Faults apply to operations on paths containing
/// `path_filter` (all paths when empty). Offsets are file offsets.
struct fault_plan {
  std::string path_filter;
  /// Operations (reads and writes, counted per op) that succeed before every
  /// further matching one fails with injected_fault; -1 = never.
  int64_t fail_after = -1;
  /// Flip every bit of the byte at this file offset in read results (-1 =
  /// off): a silent corruption the store must detect.
  int64_t corrupt_offset = -1;
  /// Reads see the file end here (-1 = off): a truncated file.
  int64_t truncate_at = -1;
  /// Sleep this long before each matching operation (a slow disk).
  std::chrono::nanoseconds delay{0};
  /// Writes fail with ENOSPC (disk full) when true.
  bool disk_full = false;
  /// Directory listings fail with EACCES when true.
  bool unreadable_directories = false;
};

class faulty_backend final : public storage_backend {
public:
  explicit faulty_backend(backend_ptr inner, fault_plan plan = {});

  /// Replaces the plan and resets the operation counter.
  void set_plan(fault_plan plan);

  /// Faults injected so far.
  uint64_t injected() const {
    return injected_;
  }

  std::string name() const override;
  uint32_t queue_depth() const override;
  std::vector<read_result> read(const std::vector<read_op>& ops,
                                io_mode mode) override;
  caf::error write_atomic(const std::string& path, const std::byte* data,
                          size_t len, durability sync) override;
  caf::expected<std::vector<std::string>> list(const std::string& dir) override;
  caf::error make_dir(const std::string& dir) override;

private:
  fault_plan plan() const;
  bool matches(const fault_plan& p, const std::string& path) const;
  // Counts a matching op; true if it must fail (fail_after reached).
  bool count_op(const fault_plan& p);

  backend_ptr inner_;
  mutable std::mutex mtx_;
  fault_plan plan_;
  int64_t ops_ = 0;
  std::atomic<uint64_t> injected_{0};
};

} // namespace dualpath::transport::storage
