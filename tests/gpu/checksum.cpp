// ctest-label: engines
// The Layer Block checksum's host reference (gpu/checksum.hpp): pinned
// values, so the definition the CUDA kernel implements cannot drift, and the
// properties that make it a useful check of bytes that reached GPU memory.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu/checksum.hpp"

using namespace dualpath::gpu;

namespace {

uint64_t sum_of(const std::string& s) {
  return block_checksum(reinterpret_cast<const std::byte*>(s.data()), s.size());
}

uint64_t sum_of(const std::vector<std::byte>& v) {
  return block_checksum(v.data(), v.size());
}

} // namespace

TEST_CASE("checksum: pinned values of the definition") {
  // Computed independently (Python, from the definition in checksum.hpp).
  CHECK_EQ(sum_of(std::string{}), 0x0ull);
  CHECK_EQ(sum_of(std::string(8, '\0')), 0xc72d5c48e2ea9df6ull);
  std::string one_to_eleven;
  for (char c = 1; c <= 11; ++c)
    one_to_eleven.push_back(c);
  CHECK_EQ(sum_of(one_to_eleven), 0x8e7565dc929a7cull);
  CHECK_EQ(sum_of("dualpath layer block"), 0x8edbef6a740192d2ull);
}

TEST_CASE("checksum: detects flipped bits, swapped words, extra zeros") {
  std::vector<std::byte> block(656 * 64);
  for (size_t i = 0; i < block.size(); ++i)
    block[i] = static_cast<std::byte>((i * 131 + 7) & 0xFF);
  const auto base = sum_of(block);
  for (size_t pos : {size_t{0}, size_t{655}, block.size() - 1}) {
    auto flipped = block;
    flipped[pos] ^= std::byte{0x01};
    CHECK_NE(sum_of(flipped), base);
  }
  auto swapped = block; // swap words 0 and 1 (a misplaced row)
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  REQUIRE(swapped != block);
  CHECK_NE(sum_of(swapped), base);
  auto longer = block;
  longer.push_back(std::byte{0}); // trailing zero is not padding
  CHECK_NE(sum_of(longer), base);
}

TEST_CASE("checksum: any split into word ranges gives the same value") {
  // What lets the GPU reduce in parallel: partial sums add up.
  std::vector<std::byte> block(10007);
  for (size_t i = 0; i < block.size(); ++i)
    block[i] = static_cast<std::byte>((i * i + 3) & 0xFF);
  const size_t words = (block.size() + 7) / 8;
  for (size_t split : {size_t{1}, size_t{17}, words / 2, words - 1}) {
    uint64_t sum = checksum_partial_sum(block.data(), block.size(), 0, split)
                   + checksum_partial_sum(block.data(), block.size(), split,
                                          words - split);
    CHECK_EQ(checksum_finish(sum, block.size()), sum_of(block));
  }
}
