// ctest-label: engines
// Host memory for pinning (gpu/host_memory.hpp): page-aligned whole pages,
// so two buffers pinned side by side never share a page (cudaHostRegister
// refuses a page registered twice).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "gpu/host_memory.hpp"

using namespace dualpath::gpu;

namespace {

uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

} // namespace

TEST_CASE("host memory is whole pages of its own") {
  const auto page = host_page_size();
  REQUIRE(page >= 4096);
  CHECK((page & (page - 1)) == 0);
  // Small buffers a heap would pack into one page get a page each.
  std::vector<host_memory> bufs;
  for (size_t n : {1, 8, 100, 4095, 4096, 4097, 3 * 4096 + 1})
    bufs.push_back(allocate_host_memory(n));
  for (auto& b : bufs) {
    REQUIRE(b);
    CHECK(address(b.get()) % page == 0);
  }
  for (size_t i = 0; i < bufs.size(); ++i)
    for (size_t j = i + 1; j < bufs.size(); ++j)
      CHECK(address(bufs[i].get()) / page != address(bufs[j].get()) / page);
  CHECK_FALSE(allocate_host_memory(0));
  CHECK_FALSE(allocate_host_memory(SIZE_MAX));
  // The vector allocator tests and benchmarks pin with.
  std::vector<std::byte, page_allocator<std::byte>> a(10), b(10);
  CHECK(address(a.data()) % page == 0);
  CHECK(address(b.data()) % page == 0);
  CHECK(address(a.data()) / page != address(b.data()) / page);
}
