#include "gpu/device_pages.hpp"

namespace dualpath::gpu {

device_pages::~device_pages() = default;

caf::error
device_pages::check_chunks(const char* what,
                           const std::vector<copy_chunk>& chunks) const {
  for (auto& c : chunks)
    if (c.length > size_ || c.src_offset > size_ - c.length
        || c.dst_offset > size_ - c.length)
      return caf::make_error(
          gpu_errc::out_of_bounds,
          std::string{what} + ": chunk of " + std::to_string(c.length)
              + " bytes at " + std::to_string(c.src_offset) + " -> "
              + std::to_string(c.dst_offset) + " is outside the "
              + std::to_string(size_) + " bytes of the device pages");
  return caf::none;
}

#if !DUALPATH_HAVE_CUDA
// Built without nvcc: no device pages (gpu/cuda_device_pages.cpp is not
// compiled); probe_cuda() says why.
caf::expected<std::unique_ptr<device_pages>> device_pages::make(void*, size_t) {
  return probe_cuda().error();
}
#endif

} // namespace dualpath::gpu
