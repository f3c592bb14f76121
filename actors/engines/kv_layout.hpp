// KV layouts of the engines and the deterministic KV content they compute,
// shared by the prefill engine, the layer streamer, the decode engine and the
// tests (CAF-free pure functions).
//
// Layouts (real bytes; `bpt` = real bytes per token per layer):
//   - Full Block (storage, reader leases, the decode node's buffer): [layer]
//     [token-in-block][bpt]. The decode node holds a prompt as one buffer
//     slot per block, so no layout conversion ever happens: storage reads
//     Full Blocks, layer streaming writes Layer Blocks (one layer's rows of a
//     block) into them.
//   - prefill GPU memory (and its host staging) for one resident layer of a
//     step: [chunk][token][bpt], each chunk holding the tokens its attention
//     reads (cached and new), chunks in batch order.
//
// Content: token t of a prompt holds, in layer l, kv_fill_token(h, l, t % B)
// where h is the hash of the block holding t (block_hashes() chains the full
// blocks). A trailing partial block has the hash chain_hash(parent, its
// tokens) it would have as a block of that length (prompt_block_hashes): the
// KV of its tokens is "computed" from that hash. When a later turn extends the
// partial block to a full one, the full block's hash differs and its KV is
// computed anew: partial blocks are never persisted and always recomputed.
//
// Thread safety: pure functions (CAF-free apart from gpu::segment_grid).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "actors/protocol/messages.hpp"
#include "actors/protocol/token_list.hpp"
#include "gpu/device.hpp"
#include "transport/types.hpp"

namespace dualpath::actors {

/// Hashes of every block of `tokens`: the full blocks (block_hashes) and, if
/// tokens.size() is not a multiple of `block_tokens`, the trailing partial
/// block's chain hash over its tokens.
std::vector<transport::block_hash>
prompt_block_hashes(const std::vector<uint32_t>& tokens, uint32_t block_tokens);

/// The same for a shared prompt: its full blocks' hashes come from the
/// list's cache (token_list::block_hashes).
std::vector<transport::block_hash> prompt_block_hashes(const token_list& tokens,
                                                       uint32_t block_tokens);

/// Fills the KV of tokens [first, last) of layer `layer` of a prompt whose
/// block hashes are `hashes`, writing token t at dst + (t - first) * bpt.
void fill_tokens(const std::vector<transport::block_hash>& hashes,
                 uint32_t block_tokens, uint32_t layer, uint32_t first,
                 uint32_t last, size_t bpt, std::byte* dst);

/// Byte offset of token `t` of a block (0 <= t < block_tokens) in layer
/// `layer` of a Full Block payload ([layer][token in block][bpt]).
inline uint64_t block_offset(uint32_t layer, uint32_t t, uint32_t block_tokens,
                             uint64_t bpt) {
  return (uint64_t{layer} * block_tokens + t) * bpt;
}

/// The part of a token range that lies in one block of the prompt.
struct block_segment {
  uint32_t block = 0;          ///< Block index in the prompt.
  uint32_t token_in_block = 0; ///< First token's position in the block.
  uint32_t tokens = 0;         ///< Tokens of the range in this block.
  uint32_t first_token = 0;    ///< First token's position in the prompt.
};

/// Cuts the prompt's tokens [first, first + count) at block boundaries.
std::vector<block_segment> block_segments(uint32_t first, uint32_t count,
                                          uint32_t block_tokens);

/// Whether block `block` of a prompt of `tokens` tokens holds the exact KV
/// of every layer in its payload (Full Block layout; a trailing partial
/// block holds min(block_tokens, tokens - block * block_tokens) tokens).
bool check_block(const std::vector<transport::block_hash>& hashes,
                 uint32_t block, uint32_t block_tokens, uint32_t layers,
                 uint32_t tokens, size_t bpt, const std::byte* payload);

/// Fills block `block`'s payload with its exact KV (see check_block).
void fill_block(const std::vector<transport::block_hash>& hashes,
                uint32_t block, uint32_t block_tokens, uint32_t layers,
                uint32_t tokens, size_t bpt, std::byte* payload);

/// A prompt in GPU memory as the decode node copies it there (its Full
/// Blocks one after another) seen as segment grids (gpu::segment_grid) of
/// its Layer Blocks: the full blocks' (row k * layers + l = block k, layer
/// l) and, for a trailing partial block, its own (rows = layers, segments
/// of its tokens only; empty when there is none).
struct prompt_grids {
  gpu::segment_grid full;
  gpu::segment_grid partial;

  size_t count() const {
    return full.count() + partial.count();
  }
};

prompt_grids grids_of(uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                      size_t bpt);

/// The checksum (gpu::block_checksum) every Layer Block of such a prompt
/// must have, in grids_of() order: computed from the deterministic content.
std::vector<uint64_t>
prompt_checksums(const std::vector<transport::block_hash>& hashes,
                 uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                 size_t bpt);

/// The blocks of such a prompt whose every Layer Block checksum in
/// `actual` (grids_of() order) equals `expected`'s, and the others.
struct block_tally {
  uint32_t ok = 0;
  uint32_t failed = 0;
};
block_tally check_prompt_checksums(const std::vector<uint64_t>& expected,
                                   const uint64_t* actual, uint32_t layers,
                                   uint32_t blocks);

/// The Full Block payload of a lease in this process (the lease's region
/// belongs to this node's reader): region.base + region.offset, skipping a
/// file header if the region covers a whole block file.
const std::byte* lease_payload(const buffer_lease& lease,
                               uint64_t payload_bytes);

} // namespace dualpath::actors
