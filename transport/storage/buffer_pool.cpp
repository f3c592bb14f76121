#include "transport/storage/buffer_pool.hpp"

#include "transport/storage/block_format.hpp"
#include "transport/storage/errors.hpp"

namespace dualpath::transport::storage {

caf::expected<std::shared_ptr<buffer_pool>>
buffer_pool::make(uint64_t budget_bytes, uint64_t slot_bytes) {
  slot_bytes = align_up(slot_bytes == 0 ? 1 : slot_bytes, io_alignment);
  auto slots = budget_bytes / slot_bytes;
  if (slots == 0)
    return caf::make_error(storage_errc::over_budget,
                           "buffer budget of " + std::to_string(budget_bytes)
                               + " bytes holds no block of "
                               + std::to_string(slot_bytes) + " bytes");
  auto mem = aligned_buffer::make(slots * slot_bytes);
  if (!mem)
    return std::move(mem.error());
  return std::shared_ptr<buffer_pool>{new buffer_pool(
      std::move(*mem), slot_bytes, static_cast<uint32_t>(slots))};
}

buffer_pool::buffer_pool(aligned_buffer mem, uint64_t slot_bytes,
                         uint32_t slots)
    : mem_(std::move(mem)), slot_bytes_(slot_bytes), slots_(slots) {
  // Hand out low slots first (reverse order on the stack).
  for (uint32_t i = slots; i > 0; --i)
    free_.push_back(i - 1);
}

std::optional<uint32_t> buffer_pool::acquire() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (free_.empty())
    return std::nullopt;
  auto i = free_.back();
  free_.pop_back();
  high_water_ =
      std::max(high_water_, slots_ - static_cast<uint32_t>(free_.size()));
  return i;
}

void buffer_pool::release(uint32_t index) {
  std::lock_guard<std::mutex> guard{mtx_};
  free_.push_back(index);
}

uint32_t buffer_pool::in_use() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return slots_ - static_cast<uint32_t>(free_.size());
}

uint32_t buffer_pool::high_water() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return high_water_;
}

} // namespace dualpath::transport::storage
