#include "transport/storage/block_index.hpp"

#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include <sys/mman.h>

namespace dualpath::transport::storage {

namespace {

constexpr size_t huge_page = size_t{2} << 20;
constexpr size_t mapped_from = size_t{4} << 20; // smaller: calloc

} // namespace

block_index::slot_table::slot_table(size_t n) : n_(n) {
  if (n == 0)
    return;
  size_t bytes = n * sizeof(slot);
  if (bytes >= mapped_from) {
    // One huge page more than needed, so that the table starts on a huge
    // page boundary (the kernel backs only aligned 2 MiB ranges).
    size_t len = bytes + huge_page;
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      auto addr = reinterpret_cast<uintptr_t>(m);
      auto aligned = (addr + huge_page - 1) & ~(uintptr_t{huge_page} - 1);
      // Advice only: without THP the table still works, on 4 KiB pages.
      (void)madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
      map_ = m;
      map_bytes_ = len;
      data_ = reinterpret_cast<slot*>(aligned);
      return;
    }
  }
  data_ = static_cast<slot*>(std::calloc(n, sizeof(slot)));
  if (data_ == nullptr) {
    n_ = 0;
    throw std::bad_alloc{};
  }
}

block_index::slot_table::slot_table(slot_table&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      n_(std::exchange(other.n_, 0)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)) {
}

block_index::slot_table&
block_index::slot_table::operator=(slot_table&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    n_ = std::exchange(other.n_, 0);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
  }
  return *this;
}

block_index::slot_table::~slot_table() {
  release();
}

void block_index::slot_table::release() noexcept {
  if (map_ != nullptr)
    munmap(map_, map_bytes_);
  else
    std::free(data_);
  data_ = nullptr;
  n_ = 0;
  map_ = nullptr;
  map_bytes_ = 0;
}

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

void block_index::reserve(size_t n) {
  size_t slots = slots_.empty() ? 64 : slots_.size();
  while (n * 4 > slots * 3)
    slots *= 2;
  if (slots != slots_.size())
    rehash(slots);
}

void block_index::grow() {
  rehash(slots_.empty() ? 64 : slots_.size() * 2);
}

void block_index::rehash(size_t n) {
  slot_table old = std::exchange(slots_, slot_table{n}); // zeroed: all empty
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
