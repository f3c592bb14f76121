// buffer_pool: a storage reader's DRAM budget, allocated once (aligned for
// O_DIRECT) and cut into equal slots of one block file each. Because the whole
// pool is one allocation, the bulk transport can register it once (base(),
// size()) and remote peers address a slot as a remote_region at an offset.
// When every slot is leased, acquire() fails and the reader waits: memory
// never grows beyond the budget.
//
// Thread safety: acquire/release/in_use/high_water are thread-safe.
// Ownership: owns the allocation; shared (shared_ptr) by the reader actor and
// whoever registers the memory; slot bytes belong to the slot's lease holder.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <caf/expected.hpp>

#include "transport/storage/backend.hpp"

namespace dualpath::transport::storage {

class buffer_pool {
public:
  /// A pool of floor(budget_bytes / slot_bytes) slots of `slot_bytes` each
  /// (slot_bytes rounded up to io_alignment). Fails with over_budget if not
  /// even one slot fits.
  static caf::expected<std::shared_ptr<buffer_pool>> make(uint64_t budget_bytes,
                                                          uint64_t slot_bytes);

  std::byte* base() const {
    return mem_.data();
  }

  /// Bytes allocated (slots() * slot_bytes(), never above the budget).
  uint64_t size() const {
    return uint64_t{slots_} * slot_bytes_;
  }

  uint64_t slot_bytes() const {
    return slot_bytes_;
  }

  uint32_t slots() const {
    return slots_;
  }

  std::byte* slot(uint32_t index) const {
    return base() + uint64_t{index} * slot_bytes_;
  }

  uint64_t offset_of(uint32_t index) const {
    return uint64_t{index} * slot_bytes_;
  }

  /// A free slot, or none when the budget is used up.
  std::optional<uint32_t> acquire();

  /// Returns a slot taken by acquire().
  void release(uint32_t index);

  uint32_t in_use() const;

  /// The most slots ever in use at once.
  uint32_t high_water() const;

private:
  buffer_pool(aligned_buffer mem, uint64_t slot_bytes, uint32_t slots);

  aligned_buffer mem_;
  uint64_t slot_bytes_;
  uint32_t slots_;
  mutable std::mutex mtx_;
  std::vector<uint32_t> free_;
  uint32_t high_water_ = 0;
};

} // namespace dualpath::transport::storage
