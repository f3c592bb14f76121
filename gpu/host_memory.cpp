#include "gpu/host_memory.hpp"

#include <cstdint>

#include <unistd.h>

namespace dualpath::gpu {

size_t host_page_size() {
  static const size_t page = [] {
    auto n = sysconf(_SC_PAGESIZE);
    return n > 0 ? static_cast<size_t>(n) : size_t{4096};
  }();
  return page;
}

host_memory allocate_host_memory(size_t bytes) {
  const size_t page = host_page_size();
  if (bytes == 0 || bytes > SIZE_MAX - (page - 1))
    return nullptr;
  const size_t rounded = (bytes + page - 1) / page * page;
  return host_memory{
      static_cast<std::byte*>(std::aligned_alloc(page, rounded))};
}

} // namespace dualpath::gpu
