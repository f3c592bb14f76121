// The Layer Block checksum (gpu/checksum.hpp) computed where the bytes lie: in
// device memory. One grid-stride pass sums the position-keyed word terms; each
// warp reduces its partial sums with shuffles and adds them to one 64-bit
// accumulator with atomicAdd (addition mod 2^64 is order-independent, so the
// result equals the host reference regardless of scheduling).

#include <cstdint>

#include "gpu/checksum.hpp"
#include "gpu/cuda_kernels.hpp"

namespace dualpath::gpu::cuda_kernels {

namespace {

constexpr unsigned threads_per_block = 256; // a multiple of the warp size
constexpr size_t max_blocks = 2048;         // enough to fill an H200 (132 SMs)

__global__ void checksum_sum_kernel(const unsigned char* data, size_t length,
                                    unsigned long long* sum_out) {
  const size_t words = (length + 7) / 8;
  const size_t full_words = length / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 7u) == 0;
  uint64_t local = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    uint64_t word = 0;
    if (aligned && i < full_words) {
      word = reinterpret_cast<const uint64_t*>(data)[i];
    } else {
      // Unaligned start or the zero-padded last word: assemble
      // little-endian byte by byte.
      const size_t n = i < full_words ? 8 : length - i * 8;
      for (size_t b = 0; b < n; ++b)
        word |= uint64_t{data[i * 8 + b]} << (8 * b);
    }
    local += checksum_term(word, i);
  }
  // Every thread of the block reaches this point (the loop bound is uniform
  // per thread, not a barrier), so full-mask shuffles are valid.
  for (int offset = 16; offset > 0; offset >>= 1)
    local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31u) == 0 && local != 0)
    atomicAdd(sum_out, static_cast<unsigned long long>(local));
}

} // namespace

cudaError_t enqueue_checksum_sum(const std::byte* data, size_t length,
                                 unsigned long long* sum_out, cudaStream_t s) {
  auto rc = cudaMemsetAsync(sum_out, 0, sizeof(*sum_out), s);
  if (rc != cudaSuccess)
    return rc;
  const size_t words = (length + 7) / 8;
  if (words == 0)
    return cudaSuccess;
  size_t blocks = (words + threads_per_block - 1) / threads_per_block;
  if (blocks > max_blocks)
    blocks = max_blocks;
  checksum_sum_kernel<<<static_cast<unsigned>(blocks), threads_per_block, 0,
                        s>>>(reinterpret_cast<const unsigned char*>(data),
                             length, sum_out);
  return cudaGetLastError();
}

} // namespace dualpath::gpu::cuda_kernels
