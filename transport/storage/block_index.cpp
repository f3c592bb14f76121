#include "transport/storage/block_index.hpp"

namespace dualpath::transport::storage {

size_t block_index::home(uint64_t key) const {
  // Fibonacci hashing: the top bits of key * 2^64/phi spread any key set
  // (also keys that share low bits) over the table.
  return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
}

const uint64_t* block_index::find(uint64_t key) const {
  if (key == 0)
    return has_zero_ ? &zero_parent_ : nullptr;
  if (slots_.empty())
    return nullptr;
  const size_t mask = slots_.size() - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    auto& s = slots_[i];
    if (s.key == key)
      return &s.parent;
    if (s.key == 0)
      return nullptr;
  }
}

bool block_index::insert(uint64_t key, uint64_t parent) {
  if (key == 0) {
    if (has_zero_)
      return false;
    has_zero_ = true;
    zero_parent_ = parent;
    ++size_;
    return true;
  }
  // At most 3/4 full, so probing always ends at an empty slot.
  if ((size_ + 1) * 4 > slots_.size() * 3)
    grow();
  const size_t mask = slots_.size() - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    auto& s = slots_[i];
    if (s.key == key)
      return false;
    if (s.key == 0) {
      s.key = key;
      s.parent = parent;
      ++size_;
      return true;
    }
  }
}

void block_index::grow() {
  std::vector<slot> old;
  old.swap(slots_);
  size_t n = old.empty() ? 64 : old.size() * 2;
  slots_.assign(n, slot{});
  shift_ = 64;
  for (size_t x = n; x > 1; x >>= 1)
    --shift_;
  const size_t mask = n - 1;
  for (auto& s : old) {
    if (s.key == 0)
      continue;
    size_t i = home(s.key);
    while (slots_[i].key != 0)
      i = (i + 1) & mask;
    slots_[i] = s;
  }
}

} // namespace dualpath::transport::storage
