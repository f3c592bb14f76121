// The Layer Block checksum (gpu/checksum.hpp) computed where the bytes lie: in
// device memory. One range: one grid-stride pass sums the position-keyed word
// terms; each warp reduces its partial sums with shuffles and adds them to one
// 64-bit accumulator with atomicAdd (addition mod 2^64 is order-independent,
// so the result equals the host reference regardless of scheduling). Many
// segments (the Layer Blocks of a decode slot): one warp per segment, lanes
// striding over its words, a shuffle reduction, lane 0 finishes and stores
// the checksum; no atomics, one 8-byte result per segment.

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

/// Word `i` of the `length` bytes at `data`, little-endian, zero-padded.
__device__ uint64_t load_word(const unsigned char* data, size_t length,
                              size_t i, bool aligned) {
  if (aligned && (i + 1) * 8 <= length)
    return reinterpret_cast<const uint64_t*>(data)[i];
  const size_t n = (i + 1) * 8 <= length ? 8 : length - i * 8;
  uint64_t word = 0;
  for (size_t b = 0; b < n; ++b)
    word |= uint64_t{data[i * 8 + b]} << (8 * b);
  return word;
}

__global__ void segment_checksum_kernel(const unsigned char* base, size_t rows,
                                        size_t row_stride, size_t row_bytes,
                                        size_t segment_bytes, uint64_t* out) {
  const size_t per_row = (row_bytes + segment_bytes - 1) / segment_bytes;
  const size_t count = rows * per_row;
  const unsigned lane = threadIdx.x & 31u;
  const size_t warps = size_t{gridDim.x} * (blockDim.x / 32);
  const size_t first =
      size_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  // The loop bound is uniform within a warp: full-mask shuffles are valid.
  for (size_t seg = first; seg < count; seg += warps) {
    const size_t r = seg / per_row;
    const size_t k = seg % per_row;
    const unsigned char* data = base + r * row_stride + k * segment_bytes;
    const size_t rest = row_bytes - k * segment_bytes;
    const size_t len = rest < segment_bytes ? rest : segment_bytes;
    const size_t words = (len + 7) / 8;
    const bool aligned = (reinterpret_cast<uintptr_t>(data) & 7u) == 0;
    uint64_t local = 0;
    for (size_t i = lane; i < words; i += 32)
      local += checksum_term(load_word(data, len, i, aligned), i);
    for (int offset = 16; offset > 0; offset >>= 1)
      local += __shfl_down_sync(0xffffffffu, local, offset);
    if (lane == 0)
      out[seg] = checksum_finish(local, len);
  }
}

} // namespace

cudaError_t enqueue_segment_checksums(const std::byte* base, size_t rows,
                                      size_t row_stride, size_t row_bytes,
                                      size_t segment_bytes, uint64_t* out,
                                      cudaStream_t s) {
  if (segment_bytes == 0 || rows == 0 || row_bytes == 0)
    return cudaSuccess;
  const size_t count = rows * ((row_bytes + segment_bytes - 1) / segment_bytes);
  constexpr size_t warps_per_block = threads_per_block / 32;
  size_t blocks = (count + warps_per_block - 1) / warps_per_block;
  if (blocks > max_blocks)
    blocks = max_blocks;
  segment_checksum_kernel<<<static_cast<unsigned>(blocks), threads_per_block, 0,
                            s>>>(reinterpret_cast<const unsigned char*>(base),
                                 rows, row_stride, row_bytes, segment_bytes,
                                 out);
  return cudaGetLastError();
}

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
