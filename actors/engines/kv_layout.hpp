// KV layouts of the engines and the deterministic KV content they compute,
// shared by the prefill engine, the layer streamer, the decode engine and the
// tests (CAF-free pure functions).
//
// Layouts (real bytes; `bpt` = real bytes per token per layer):
//   - Full Block (storage, reader leases): [layer][token-in-block][bpt].
//   - decode slot of a request: [layer][prompt token][bpt]: layer l of the
//     whole prompt is one contiguous range, written once per layer.
//   - prefill GPU memory (and its host staging) for one resident layer of a
//     batch: [request][prompt token][bpt], requests in batch order.
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

/// The outcome of checking a decode slot against the deterministic content.
struct slot_check {
  uint32_t blocks_ok = 0;     ///< Blocks (partial one included) all exact.
  uint32_t blocks_failed = 0; ///< Blocks with at least one wrong byte.
};

/// Checks a whole decode slot ([layer][token][bpt], `tokens` tokens).
slot_check check_slot(const std::vector<transport::block_hash>& hashes,
                      uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                      size_t bpt, const std::byte* slot);

/// The Layer Blocks of a decode slot as a segment grid (gpu::segment_grid):
/// one row per layer, one segment per block (the last one shorter for a
/// partial block); result l * blocks + b is block b of layer l.
gpu::segment_grid slot_grid(uint32_t block_tokens, uint32_t layers,
                            uint32_t tokens, size_t bpt);

/// The checksum (gpu::block_checksum) every Layer Block of a decode slot
/// must have, in slot_grid() order: computed from the deterministic content,
/// without the slot.
std::vector<uint64_t>
slot_checksums(const std::vector<transport::block_hash>& hashes,
               uint32_t block_tokens, uint32_t layers, uint32_t tokens,
               size_t bpt);

/// check_slot() from Layer Block checksums measured where the KV lies
/// (`actual`, slot_grid() order) against slot_checksums() (`expected`): a
/// block is exact when all its layers match.
slot_check check_slot_checksums(const std::vector<uint64_t>& expected,
                                const uint64_t* actual, uint32_t layers,
                                size_t hashes);

/// Byte offset of token `token` of layer `layer` in a decode slot.
inline uint64_t slot_offset(uint32_t layer, uint32_t tokens, uint32_t token,
                            uint64_t bpt) {
  return (uint64_t{layer} * tokens + token) * bpt;
}

/// The Full Block payload of a lease in this process (the lease's region
/// belongs to this node's reader): region.base + region.offset, skipping a
/// file header if the region covers a whole block file.
const std::byte* lease_payload(const buffer_lease& lease,
                               uint64_t payload_bytes);

} // namespace dualpath::actors
