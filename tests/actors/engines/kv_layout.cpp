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

TEST_CASE("a prompt in Full Blocks checks exact; a flipped byte fails") {
  // The decode node holds a prompt as one Full Block per block: decode-side
  // hits as storage read them, the rest written Layer Block by Layer Block.
  const uint32_t layers = 3, bt = 4, tokens = 10, bpt = 24;
  std::vector<uint32_t> ids(tokens);
  for (uint32_t i = 0; i < tokens; ++i)
    ids[i] = 50 + i;
  auto hashes = prompt_block_hashes(ids, bt);
  REQUIRE_EQ(hashes.size(), 3u); // 4 + 4 + a partial block of 2
  const size_t payload = size_t{layers} * bt * bpt;
  std::vector<std::vector<std::byte>> blocks(3,
                                             std::vector<std::byte>(payload));
  // Block 0 as the store holds it (one Layer Block after another).
  for (uint32_t l = 0; l < layers; ++l)
    storage::kv_fill_layer(hashes[0], l, bt, bpt,
                           blocks[0].data() + block_offset(l, 0, bt, bpt));
  // Tokens 4..10 of every layer as a prefill engine writes them, cut at
  // block boundaries (block 1 whole, the partial block 2).
  auto segs = block_segments(4, 6, bt);
  REQUIRE_EQ(segs.size(), 2u);
  CHECK_EQ(segs[0].block, 1u);
  CHECK_EQ(segs[0].tokens, 4u);
  CHECK_EQ(segs[1].block, 2u);
  CHECK_EQ(segs[1].token_in_block, 0u);
  CHECK_EQ(segs[1].tokens, 2u);
  CHECK_EQ(segs[1].first_token, 8u);
  for (uint32_t l = 0; l < layers; ++l)
    for (auto& seg : segs)
      fill_tokens(hashes, bt, l, seg.first_token, seg.first_token + seg.tokens,
                  bpt,
                  blocks[seg.block].data()
                      + block_offset(l, seg.token_in_block, bt, bpt));
  for (uint32_t b = 0; b < 3; ++b)
    CHECK(check_block(hashes, b, bt, layers, tokens, bpt, blocks[b].data()));
  // fill_block writes what check_block expects, the partial block included.
  std::vector<std::byte> filled(payload);
  fill_block(hashes, 2, bt, layers, tokens, bpt, filled.data());
  CHECK(check_block(hashes, 2, bt, layers, tokens, bpt, filled.data()));
  // Token 9 (the partial block's second) in layer 1; block 0 in layer 2.
  blocks[2][block_offset(1, 1, bt, bpt) + 5] ^= std::byte{1};
  CHECK_FALSE(
      check_block(hashes, 2, bt, layers, tokens, bpt, blocks[2].data()));
  blocks[0][block_offset(2, 3, bt, bpt)] ^= std::byte{4};
  CHECK_FALSE(
      check_block(hashes, 0, bt, layers, tokens, bpt, blocks[0].data()));
  CHECK(check_block(hashes, 1, bt, layers, tokens, bpt, blocks[1].data()));
  // No block past the prompt.
  CHECK_FALSE(check_block(hashes, 3, bt, layers, tokens, bpt, filled.data()));
  CHECK(block_segments(8, 0, bt).empty());
}
