// A first-fit allocator of byte ranges inside one fixed buffer (a decode
// engine's DRAM buffer): allocate() fails (no range) when no free range is
// large enough, so callers wait for frees instead of growing memory.
// Adjacent free ranges are merged on free().
//
// Thread safety: none (owned by one actor). Ownership: value type.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace dualpath::actors {

class range_allocator {
public:
  explicit range_allocator(uint64_t capacity = 0);

  /// The offset of a free range of `bytes` (> 0), or none.
  std::optional<uint64_t> allocate(uint64_t bytes);

  /// Returns a range handed out by allocate().
  void free(uint64_t offset);

  uint64_t capacity() const {
    return capacity_;
  }

  uint64_t used() const {
    return used_;
  }

  uint64_t high_water() const {
    return high_water_;
  }

private:
  uint64_t capacity_;
  uint64_t used_ = 0;
  uint64_t high_water_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length
  std::map<uint64_t, uint64_t> taken_; // offset -> length
};

} // namespace dualpath::actors
