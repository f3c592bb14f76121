// Host-side entry points of the gpu module's CUDA kernels (gpu/cuda_*.cu),
// for the cuda backend only. Plain CUDA runtime types, no CAF, so that nvcc
// and g++ both compile this header.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dualpath::gpu::cuda_kernels {

/// Enqueues on `s` the sum of checksum terms (gpu/checksum.hpp) of the
/// `length` bytes at device address `data` into `*sum_out` (device memory,
/// 8 bytes, zeroed by this call first). The caller finishes the checksum with
/// checksum_finish(sum, length) once the stream reaches this point. Returns
/// the launch status (cudaSuccess when enqueued).
cudaError_t enqueue_checksum_sum(const std::byte* data, size_t length,
                                 unsigned long long* sum_out, cudaStream_t s);

/// Enqueues on `s` the checksum (gpu/checksum.hpp, finished) of every
/// segment of a grid at device address `base`: `rows` rows of `row_bytes`
/// bytes, row r at base + r * row_stride, cut into segments of
/// `segment_bytes` (the last of a row shorter). Result r * segments_per_row
/// + k goes to out[...] (device memory, rows * segments_per_row values).
/// One warp per segment. Returns the launch status.
cudaError_t enqueue_segment_checksums(const std::byte* base, size_t rows,
                                      size_t row_stride, size_t row_bytes,
                                      size_t segment_bytes, uint64_t* out,
                                      cudaStream_t s);

} // namespace dualpath::gpu::cuda_kernels
