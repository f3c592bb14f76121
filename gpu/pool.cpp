#include "gpu/pool.hpp"

#include <algorithm>
#include <iterator>

namespace dualpath::gpu {

range_pool::range_pool(size_t alignment)
    : alignment_(alignment == 0 ? 1 : alignment) {
}

size_t range_pool::rounded(size_t bytes) const {
  if (bytes > SIZE_MAX - (alignment_ - 1))
    return 0; // cannot be rounded: no range is that large
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

void range_pool::add_slab(std::byte* base, size_t size) {
  if (base == nullptr || size == 0)
    return;
  auto index = static_cast<int>(slabs_.size());
  slabs_.push_back(pool_slab{base, size});
  capacity_ += size;
  free_.emplace(base, range{size, index});
}

std::byte* range_pool::take(size_t bytes) {
  auto want = rounded(bytes);
  if (bytes == 0 || want == 0)
    return nullptr;
  // First fit by address: low addresses are reused first, which keeps the
  // pool's working set compact.
  for (auto i = free_.begin(); i != free_.end(); ++i) {
    if (i->second.length < want)
      continue;
    auto ptr = i->first;
    auto rest = i->second.length - want;
    auto slab = i->second.slab;
    free_.erase(i);
    if (rest > 0)
      free_.emplace(ptr + want, range{rest, slab});
    taken_.emplace(ptr, range{want, slab});
    used_ += want;
    return ptr;
  }
  return nullptr;
}

void range_pool::give_back(std::byte* ptr) {
  auto i = taken_.find(ptr);
  if (i == taken_.end())
    return;
  auto r = i->second;
  taken_.erase(i);
  used_ -= r.length;
  auto j = free_.emplace(ptr, r).first;
  auto adjacent = [](const auto& lo, const auto& hi) {
    return lo->second.slab == hi->second.slab
           && lo->first + lo->second.length == hi->first;
  };
  if (auto n = std::next(j); n != free_.end() && adjacent(j, n)) {
    j->second.length += n->second.length;
    free_.erase(n);
  }
  if (j != free_.begin()) {
    if (auto p = std::prev(j); adjacent(p, j)) {
      p->second.length += j->second.length;
      free_.erase(j);
    }
  }
}

int range_pool::slab_of(const std::byte* ptr, size_t bytes) const {
  for (size_t i = 0; i < slabs_.size(); ++i) {
    const auto& s = slabs_[i];
    if (ptr >= s.base && ptr <= s.base + s.size
        && bytes <= static_cast<size_t>(s.base + s.size - ptr))
      return static_cast<int>(i);
  }
  return -1;
}

size_t range_pool::largest_free() const {
  size_t best = 0;
  for (auto& kv : free_)
    best = std::max(best, kv.second.length);
  return best;
}

} // namespace dualpath::gpu
