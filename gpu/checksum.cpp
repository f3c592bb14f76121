#include "gpu/checksum.hpp"

#include <cstring>

// The definition reads words little-endian; the host reference loads them with
// memcpy, which is only the same on a little-endian host (x86-64, aarch64 in
// its usual mode), as is the GPU.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "block_checksum assumes a little-endian host");

namespace dualpath::gpu {

uint64_t checksum_partial_sum(const std::byte* data, size_t len,
                              size_t first_word, size_t count) {
  uint64_t sum = 0;
  const size_t full_words = len / 8;
  const size_t end = first_word + count;
  for (size_t i = first_word; i < end; ++i) {
    uint64_t word = 0;
    if (i < full_words)
      std::memcpy(&word, data + i * 8, 8);
    else
      std::memcpy(&word, data + i * 8, len - i * 8); // zero-padded tail
    sum += checksum_term(word, i);
  }
  return sum;
}

uint64_t block_checksum(const std::byte* data, size_t len) {
  const size_t words = (len + 7) / 8;
  return checksum_finish(checksum_partial_sum(data, len, 0, words), len);
}

} // namespace dualpath::gpu
