// The Layer Block checksum: a 64-bit checksum of a byte range, defined so that
// a GPU can compute it with one parallel reduction and the host can compute
// the same value as a reference. The cuda backend computes it on device memory
// (gpu/cuda_checksum.cu) so that bytes that reached HBM are verified there;
// the host backend and tests use block_checksum() below.
//
// Definition, for a range of `len` bytes:
//   - split the range into n = ceil(len / 8) words; word i holds bytes
//     [8i, 8i+8) read little-endian, the last word zero-padded;
//   - term_i = mix64(word_i + (i + 1) * 0x9E3779B97F4A7C15)   (position-keyed)
//   - sum    = term_0 + term_1 + ... + term_{n-1}  (mod 2^64)
//   - checksum = mix64(sum ^ (len * 0xD6E8FEB86659FD93))
// mix64 is the SplitMix64 finaliser (a bijection with full avalanche). The sum
// is associative and commutative, so any split of the words across threads
// gives the same value; keying each word by its position makes swapped or
// shifted words change the checksum, and mixing in the length distinguishes
// trailing zero bytes from padding.
//
// Pure functions, thread-safe. Usable from host and device code.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#  define DUALPATH_HOST_DEVICE __host__ __device__
#else
#  define DUALPATH_HOST_DEVICE
#endif

namespace dualpath::gpu {

/// Increment keying word i by its position (golden-ratio constant).
constexpr uint64_t checksum_position_key = 0x9E3779B97F4A7C15ull;

/// Multiplier mixing the byte length into the final value.
constexpr uint64_t checksum_length_key = 0xD6E8FEB86659FD93ull;

/// SplitMix64 finaliser.
DUALPATH_HOST_DEVICE inline uint64_t checksum_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The term that word `index` (0-based) with value `word` adds to the sum.
DUALPATH_HOST_DEVICE inline uint64_t checksum_term(uint64_t word,
                                                   uint64_t index) {
  return checksum_mix64(word + (index + 1) * checksum_position_key);
}

/// Turns the sum of all terms of a `len`-byte range into the checksum.
DUALPATH_HOST_DEVICE inline uint64_t checksum_finish(uint64_t sum,
                                                     uint64_t len) {
  return checksum_mix64(sum ^ (len * checksum_length_key));
}

/// Sum of the terms of words [first_word, first_word + count) of `data`
/// (`len` bytes in all). Lets a caller split a range into pieces.
uint64_t checksum_partial_sum(const std::byte* data, size_t len,
                              size_t first_word, size_t count);

/// The checksum of `len` bytes at `data` (host reference implementation).
uint64_t block_checksum(const std::byte* data, size_t len);

} // namespace dualpath::gpu
