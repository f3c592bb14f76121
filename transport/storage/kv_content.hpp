// Deterministic KV content and block hashing, shared by the block store, the
// engines and the tests, so that a store can be pre-populated for a trace and
// every byte read back can be checked.
//
// The KV bytes of a token depend on its whole prefix: they are a function of
// the hash of the block that holds the token (which chains every earlier
// block), the layer and the token's position inside the block. The generator
// is counter-based (splitmix64 per 8 bytes), so any range can be produced or
// checked independently and fast.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/types.hpp"

namespace dualpath::transport::storage {

/// Hash of a block: xxh64 of the block's token ids (little-endian uint32)
/// seeded with the parent block's hash (`root_hash` for the first block).
block_hash chain_hash(block_hash parent, const uint32_t* tokens, size_t count);

/// The hashes of the full blocks of `tokens` (a trailing partial block has no
/// hash), chained from `root_hash`.
std::vector<block_hash> block_hashes(const std::vector<uint32_t>& tokens,
                                     uint32_t block_tokens);

/// Fills `bytes` bytes at `dst` with the KV of token `position` of the block
/// `hash` in layer `layer`.
void kv_fill_token(block_hash hash, uint32_t layer, uint32_t position,
                   std::byte* dst, size_t bytes);

/// Fills one Layer Block: `tokens` consecutive tokens of `bytes_per_token`
/// each, starting at token position 0 of the block.
void kv_fill_layer(block_hash hash, uint32_t layer, uint32_t tokens,
                   size_t bytes_per_token, std::byte* dst);

/// True if `bytes` at `src` equal kv_fill_token(hash, layer, position, ...).
bool kv_check_token(block_hash hash, uint32_t layer, uint32_t position,
                    const std::byte* src, size_t bytes);

/// True if a Layer Block at `src` equals kv_fill_layer(...).
bool kv_check_layer(block_hash hash, uint32_t layer, uint32_t tokens,
                    size_t bytes_per_token, const std::byte* src);

} // namespace dualpath::transport::storage
