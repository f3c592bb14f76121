// The bookkeeping of a device's memory pool: device memory is obtained from
// the backend in a few large slabs (cudaMalloc once per slab) and handed out
// as aligned sub-ranges, first fit, with freed ranges merged with their free
// neighbours inside the same slab. Handing out and taking back a range calls
// no backend at all, so an allocation never synchronises a stream or the
// device (cudaFree would synchronise the whole device), and a slab is one
// contiguous region that can be exported once (dma-buf) and registered once
// with an RDMA NIC.
//
// Pure bookkeeping on addresses: no memory is touched. Ranges never span two
// slabs, even when the slabs happen to be adjacent in the address space.
//
// Thread safety: none (the device guards its pool with its own mutex).
// Ownership: value type; the slabs' memory belongs to the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace dualpath::gpu {

/// One slab of a pool: where it starts and how long it is.
struct pool_slab {
  std::byte* base = nullptr;
  size_t size = 0;
};

class range_pool {
public:
  /// `alignment` (a power of two) applies to every range handed out; slab
  /// bases must have at least this alignment.
  explicit range_pool(size_t alignment = 256);

  /// Adds a slab; its whole range becomes free.
  void add_slab(std::byte* base, size_t size);

  /// A free range of `bytes` (> 0) rounded up to the alignment, or nullptr
  /// when no slab has a free range that large.
  std::byte* take(size_t bytes);

  /// Returns a range handed out by take(); unknown pointers are ignored.
  void give_back(std::byte* ptr);

  /// `bytes` rounded up to the alignment (what take(bytes) reserves).
  size_t rounded(size_t bytes) const;

  /// Index of the slab holding [ptr, ptr + bytes), or -1.
  int slab_of(const std::byte* ptr, size_t bytes) const;

  const std::vector<pool_slab>& slabs() const {
    return slabs_;
  }

  /// Bytes of all slabs.
  size_t capacity() const {
    return capacity_;
  }

  /// Bytes handed out (rounded).
  size_t used() const {
    return used_;
  }

  /// Length of the largest free range.
  size_t largest_free() const;

private:
  struct range {
    size_t length;
    int slab;
  };

  size_t alignment_;
  size_t capacity_ = 0;
  size_t used_ = 0;
  std::vector<pool_slab> slabs_;
  std::map<std::byte*, range> free_;  // by address
  std::map<std::byte*, range> taken_; // by address
};

} // namespace dualpath::gpu
