// ctest-label: engines
// The pool's bookkeeping (gpu/pool.hpp) on plain addresses: aligned first-fit
// ranges, merging of freed neighbours within a slab but never across two
// adjacent slabs, and refusal when no free range is large enough.
#include <doctest/doctest.h>

#include <vector>

#include "gpu/pool.hpp"

using namespace dualpath::gpu;

namespace {

// Addresses only: the pool never touches the memory.
std::byte* at(std::vector<std::byte>& arena, size_t offset) {
  return arena.data() + offset;
}

} // namespace

TEST_CASE("ranges are aligned, first fit, and merged when freed") {
  std::vector<std::byte> arena(8192 + 256);
  auto base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(arena.data()) + 255) / 256 * 256);
  range_pool pool{256};
  pool.add_slab(base, 4096);
  CHECK_EQ(pool.capacity(), 4096u);
  auto a = pool.take(100); // rounded to 256
  auto b = pool.take(256);
  auto c = pool.take(1000); // 1024
  REQUIRE((a && b && c));
  CHECK_EQ(a, base);
  CHECK_EQ(b, base + 256);
  CHECK_EQ(c, base + 512);
  CHECK_EQ(pool.used(), 256u + 256 + 1024);
  CHECK_EQ(pool.largest_free(), 4096u - 1536);
  CHECK_EQ(pool.take(4096), nullptr); // fragmented: no range that large
  pool.give_back(b);
  CHECK_EQ(pool.take(200), b); // first fit reuses the hole
  pool.give_back(a);
  pool.give_back(b);
  pool.give_back(c);
  CHECK_EQ(pool.used(), 0u);
  CHECK_EQ(pool.largest_free(), 4096u); // all merged back into one
  CHECK_EQ(pool.take(4096), base);
  pool.give_back(base + 1); // unknown pointer: ignored
  CHECK_EQ(pool.used(), 4096u);
  CHECK_EQ(pool.take(0), nullptr);
  CHECK_EQ(pool.take(SIZE_MAX), nullptr);
  CHECK_EQ(pool.slab_of(base + 100, 200), 0);
  CHECK_EQ(pool.slab_of(base + 4000, 200), -1); // runs past the slab
  CHECK_EQ(pool.slab_of(base - 1, 1), -1);
}

TEST_CASE("adjacent slabs stay separate ranges") {
  std::vector<std::byte> arena(4096);
  range_pool pool{256};
  pool.add_slab(at(arena, 0), 1024);
  pool.add_slab(at(arena, 1024), 1024); // adjacent in the address space
  CHECK_EQ(pool.slabs().size(), 2u);
  CHECK_EQ(pool.largest_free(), 1024u); // not merged into 2048
  CHECK_EQ(pool.take(2048), nullptr);   // no range spans both slabs
  auto a = pool.take(1024);
  auto b = pool.take(1024);
  REQUIRE((a && b));
  CHECK_EQ(pool.slab_of(a, 1024), 0);
  CHECK_EQ(pool.slab_of(b, 1024), 1);
  pool.give_back(a);
  pool.give_back(b);
  CHECK_EQ(pool.largest_free(), 1024u);
  CHECK_EQ(pool.take(1025), nullptr);
}
