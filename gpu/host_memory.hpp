// Host memory meant for device::pin(): page-aligned and a whole number of
// pages, so that its registration never shares a page with another one.
// cudaHostRegister pins whole pages and refuses a page that is already
// registered, so two registered buffers that happened to share a heap page
// would fail the second registration. Contents are not initialised (pages
// are touched only when bytes land there).
//
// Thread safety: value types. Ownership: host_memory owns its allocation.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace dualpath::gpu {

/// Bytes of a host page (sysconf(_SC_PAGESIZE), read once).
size_t host_page_size();

/// Frees what allocate_host_memory() returned.
struct host_memory_free {
  void operator()(std::byte* p) const noexcept {
    std::free(p);
  }
};

using host_memory = std::unique_ptr<std::byte[], host_memory_free>;

/// `bytes` (> 0) of page-aligned host memory rounded up to whole pages;
/// null when bytes is 0 or the allocation fails.
host_memory allocate_host_memory(size_t bytes);

/// A std::vector allocator of page-aligned, whole-page storage, for buffers
/// a test or benchmark pins.
template <class T>
struct page_allocator {
  using value_type = T;

  page_allocator() = default;
  template <class U>
  page_allocator(const page_allocator<U>&) noexcept {
  }

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T))
      throw std::bad_alloc{};
    auto p = allocate_host_memory(n == 0 ? 1 : n * sizeof(T));
    if (!p)
      throw std::bad_alloc{};
    return reinterpret_cast<T*>(p.release());
  }

  void deallocate(T* p, size_t) noexcept {
    std::free(p);
  }

  template <class U>
  bool operator==(const page_allocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const page_allocator<U>&) const noexcept {
    return false;
  }
};

} // namespace dualpath::gpu
