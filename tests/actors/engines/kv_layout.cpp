// ctest-label: engines
// The KV layout the engines fill and the decode engine verifies slots
// against: prompt block hashes with the trailing partial block, fill and
// check of a layer-major slot, corruption detected per block, by bytes and
// by Layer Block checksums.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "actors/engines/kv_layout.hpp"
#include "gpu/checksum.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
namespace storage = transport::storage;

TEST_CASE("prompt block hashes add the trailing partial block's chain hash") {
  std::vector<uint32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto full = storage::block_hashes(tokens, 4);
  auto all = prompt_block_hashes(tokens, 4);
  REQUIRE_EQ(full.size(), 2u);
  REQUIRE_EQ(all.size(), 3u);
  CHECK_EQ(all[0], full[0]);
  CHECK_EQ(all[1], full[1]);
  CHECK_EQ(all[2], storage::chain_hash(full[1], tokens.data() + 8, 2));
  // Extending the partial block changes its hash: its KV is recomputed.
  tokens.push_back(11);
  tokens.push_back(12);
  CHECK_NE(storage::block_hashes(tokens, 4)[2], all[2]);
  CHECK_EQ(prompt_block_hashes(std::vector<uint32_t>{1, 2, 3, 4}, 4).size(),
           1u);
  CHECK(prompt_block_hashes(std::vector<uint32_t>{}, 4).empty());
  // A shared prompt (cached full-block hashes) hashes the same.
  CHECK(prompt_block_hashes(token_list{tokens}, 4)
        == prompt_block_hashes(tokens, 4));
  CHECK(prompt_block_hashes(token_list{}, 4).empty());
}

TEST_CASE("a filled layer-major slot checks exact; a flipped byte fails") {
  const uint32_t layers = 3, bt = 4, tokens = 10, bpt = 24;
  std::vector<uint32_t> ids(tokens);
  for (uint32_t i = 0; i < tokens; ++i)
    ids[i] = 50 + i;
  auto hashes = prompt_block_hashes(ids, bt);
  std::vector<std::byte> slot(size_t{layers} * tokens * bpt);
  for (uint32_t l = 0; l < layers; ++l) {
    // In two pieces, as a split read path fills it.
    fill_tokens(hashes, bt, l, 0, 4, bpt,
                slot.data() + slot_offset(l, tokens, 0, bpt));
    fill_tokens(hashes, bt, l, 4, tokens, bpt,
                slot.data() + slot_offset(l, tokens, 4, bpt));
  }
  auto ok = check_slot(hashes, bt, layers, tokens, bpt, slot.data());
  CHECK_EQ(ok.blocks_ok, 3u);
  CHECK_EQ(ok.blocks_failed, 0u);
  // The same bytes as the store's Layer Block of a full block.
  std::vector<std::byte> layer_block(size_t{bt} * bpt);
  storage::kv_fill_layer(hashes[1], 2, bt, bpt, layer_block.data());
  CHECK(std::equal(layer_block.begin(), layer_block.end(),
                   slot.begin() + slot_offset(2, tokens, 4, bpt)));
  // Token 9 (partial block 2) in layer 1.
  slot[slot_offset(1, tokens, 9, bpt) + 5] ^= std::byte{1};
  auto bad = check_slot(hashes, bt, layers, tokens, bpt, slot.data());
  CHECK_EQ(bad.blocks_ok, 2u);
  CHECK_EQ(bad.blocks_failed, 1u);
}

TEST_CASE("Layer Block checksums of a slot: measured equals expected") {
  // What the decode engine compares after the checksum kernel ran on the
  // GPU copy: the checksums of the slot's Layer Blocks (slot_grid order)
  // against the ones the content must have.
  const uint32_t layers = 3, bt = 4, tokens = 10, bpt = 24;
  std::vector<uint32_t> ids(tokens);
  for (uint32_t i = 0; i < tokens; ++i)
    ids[i] = 70 + i;
  auto hashes = prompt_block_hashes(ids, bt);
  std::vector<std::byte> slot(size_t{layers} * tokens * bpt);
  for (uint32_t l = 0; l < layers; ++l)
    fill_tokens(hashes, bt, l, 0, tokens, bpt,
                slot.data() + slot_offset(l, tokens, 0, bpt));
  auto grid = slot_grid(bt, layers, tokens, bpt);
  REQUIRE_EQ(grid.count(), 9u); // 3 layers x (2 full blocks + 1 partial)
  auto measure = [&] {
    std::vector<uint64_t> out;
    for (uint32_t l = 0; l < layers; ++l)
      for (uint32_t b = 0; b < 3; ++b) {
        auto first = slot_offset(l, tokens, b * bt, bpt);
        auto len = size_t{std::min(bt, tokens - b * bt)} * bpt;
        out.push_back(gpu::block_checksum(slot.data() + first, len));
      }
    return out;
  };
  auto expected = slot_checksums(hashes, bt, layers, tokens, bpt);
  REQUIRE_EQ(expected.size(), grid.count());
  auto good = measure();
  CHECK(good == expected);
  auto ok = check_slot_checksums(expected, good.data(), layers, hashes.size());
  CHECK_EQ(ok.blocks_ok, 3u);
  CHECK_EQ(ok.blocks_failed, 0u);
  // One flipped byte in block 1 of layer 2: that block fails, once.
  slot[slot_offset(2, tokens, 5, bpt) + 3] ^= std::byte{0x10};
  auto bad = measure();
  auto check =
      check_slot_checksums(expected, bad.data(), layers, hashes.size());
  CHECK_EQ(check.blocks_ok, 2u);
  CHECK_EQ(check.blocks_failed, 1u);
  // A block without a hash (a prompt longer than its hashes) never passes.
  auto short_hashes =
      check_slot_checksums(expected, good.data(), layers, hashes.size() - 1);
  CHECK_EQ(short_hashes.blocks_ok, 2u);
  CHECK_EQ(short_hashes.blocks_failed, 1u);
}
