#include "actors/engines/range_allocator.hpp"

#include <algorithm>

namespace dualpath::actors {

range_allocator::range_allocator(uint64_t capacity) : capacity_(capacity) {
  if (capacity_ > 0)
    free_.emplace(0, capacity_);
}

std::optional<uint64_t> range_allocator::allocate(uint64_t bytes) {
  if (bytes == 0)
    return std::nullopt;
  for (auto i = free_.begin(); i != free_.end(); ++i) {
    if (i->second < bytes)
      continue;
    auto offset = i->first;
    auto rest = i->second - bytes;
    free_.erase(i);
    if (rest > 0)
      free_.emplace(offset + bytes, rest);
    taken_.emplace(offset, bytes);
    used_ += bytes;
    high_water_ = std::max(high_water_, used_);
    return offset;
  }
  return std::nullopt;
}

void range_allocator::free(uint64_t offset) {
  auto i = taken_.find(offset);
  if (i == taken_.end())
    return;
  auto len = i->second;
  taken_.erase(i);
  used_ -= len;
  auto j = free_.emplace(offset, len).first;
  // Merge with the next free range, then with the previous one.
  auto n = std::next(j);
  if (n != free_.end() && j->first + j->second == n->first) {
    j->second += n->second;
    free_.erase(n);
  }
  if (j != free_.begin()) {
    auto p = std::prev(j);
    if (p->first + p->second == j->first) {
      p->second += j->second;
      free_.erase(j);
    }
  }
}

} // namespace dualpath::actors
