// ctest-label: storage
// The block store's open-addressing index against std::unordered_map as the
// reference: inserts across many growths, a repeated key keeps its first
// parent, key 0 (the empty-slot marker) is an ordinary key, and keys that
// share their low bits (a weak hash's worst case) still find their entries,
// and reserve() makes room for a known number of entries without a rehash.
#include <doctest/doctest.h>

#include <random>
#include <unordered_map>

#include "transport/storage/block_index.hpp"

using dualpath::transport::storage::block_index;

TEST_CASE("block_index: agrees with a hash map over many growths") {
  block_index idx;
  std::unordered_map<uint64_t, uint64_t> ref;
  std::mt19937_64 rng{42};
  for (int i = 0; i < 200'000; ++i) {
    auto k = rng() % 150'000; // repeats: some inserts must be refused
    auto p = rng();
    CHECK_EQ(idx.insert(k, p), ref.emplace(k, p).second);
  }
  CHECK_EQ(idx.size(), ref.size());
  for (auto& [k, p] : ref) {
    auto* got = idx.find(k);
    REQUIRE(got != nullptr);
    CHECK_EQ(*got, p);
  }
  size_t absent = 0;
  for (uint64_t k = 150'000; k < 160'000; ++k)
    absent += idx.contains(k) ? 0 : 1;
  CHECK_EQ(absent, 10'000u);
  // At most 3/4 full: 16-byte slots, fewer than 2 x 16 / (3/4) bytes each.
  CHECK_LE(idx.memory_bytes(), ref.size() * 43);
}

TEST_CASE("block_index: key 0 and keys sharing low bits") {
  block_index idx;
  CHECK_FALSE(idx.contains(0));
  CHECK(idx.find(7) == nullptr);
  CHECK(idx.insert(0, 11));
  CHECK_FALSE(idx.insert(0, 12));
  REQUIRE(idx.find(0) != nullptr);
  CHECK_EQ(*idx.find(0), 11u);
  for (uint64_t i = 1; i <= 5'000; ++i)
    CHECK(idx.insert(i << 40, i));
  CHECK_EQ(idx.size(), 5'001u);
  for (uint64_t i = 1; i <= 5'000; ++i) {
    auto* p = idx.find(i << 40);
    REQUIRE(p != nullptr);
    CHECK_EQ(*p, i);
  }
  CHECK_FALSE(idx.contains(5'001ull << 40));
}

TEST_CASE("block_index: reserve makes room once, entries survive it") {
  block_index idx;
  for (uint64_t k = 1; k <= 1'000; ++k)
    CHECK(idx.insert(k, k + 7));
  // 300 K entries at most 3/4 full: 2^19 slots (8 MiB, a huge-page mapping).
  idx.reserve(300'000);
  auto bytes = idx.memory_bytes();
  CHECK_EQ(bytes, (size_t{1} << 19) * 16);
  for (uint64_t k = 1; k <= 1'000; ++k) {
    auto* p = idx.find(k);
    REQUIRE(p != nullptr);
    CHECK_EQ(*p, k + 7);
  }
  std::mt19937_64 rng{7};
  std::unordered_map<uint64_t, uint64_t> ref;
  while (ref.size() < 299'000) {
    auto k = rng() | 1u << 20; // never one of the keys above
    auto p = rng();
    CHECK_EQ(idx.insert(k, p), ref.emplace(k, p).second);
  }
  CHECK_EQ(idx.memory_bytes(), bytes); // no rehash on the way
  CHECK_EQ(idx.size(), 300'000u);
  for (auto& [k, p] : ref) {
    auto* got = idx.find(k);
    REQUIRE(got != nullptr);
    CHECK_EQ(*got, p);
  }
  idx.reserve(10); // smaller: nothing changes
  CHECK_EQ(idx.memory_bytes(), bytes);
  // Past 3/4 of 2^19 it grows as usual.
  while (idx.size() < 393'217)
    idx.insert(rng() | 1u << 20, 1);
  CHECK_EQ(idx.memory_bytes(), 2 * bytes);
}
