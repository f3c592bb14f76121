#include "actors/engines/kv_layout.hpp"

#include <algorithm>

#include "gpu/checksum.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::actors {

namespace storage = transport::storage;

namespace {

/// Appends the hash of the trailing partial block of ids[0, size) to the
/// full blocks' hashes in `result`.
std::vector<transport::block_hash>
with_tail(std::vector<transport::block_hash> result, const uint32_t* ids,
          size_t size, uint32_t block_tokens) {
  if (block_tokens == 0)
    return result;
  size_t full = result.size() * block_tokens;
  if (full < size) {
    auto parent = result.empty() ? transport::root_hash : result.back();
    result.push_back(storage::chain_hash(parent, ids + full, size - full));
  }
  return result;
}

} // namespace

std::vector<transport::block_hash>
prompt_block_hashes(const std::vector<uint32_t>& tokens,
                    uint32_t block_tokens) {
  return with_tail(storage::block_hashes(tokens, block_tokens), tokens.data(),
                   tokens.size(), block_tokens);
}

std::vector<transport::block_hash> prompt_block_hashes(const token_list& tokens,
                                                       uint32_t block_tokens) {
  return with_tail(tokens.block_hashes(block_tokens), tokens.data(),
                   tokens.size(), block_tokens);
}

void fill_tokens(const std::vector<transport::block_hash>& hashes,
                 uint32_t block_tokens, uint32_t layer, uint32_t first,
                 uint32_t last, size_t bpt, std::byte* dst) {
  for (uint32_t t = first; t < last; ++t)
    storage::kv_fill_token(hashes[t / block_tokens], layer, t % block_tokens,
                           dst + size_t{t - first} * bpt, bpt);
}

slot_check check_slot(const std::vector<transport::block_hash>& hashes,
                      uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                      size_t bpt, const std::byte* slot) {
  slot_check result;
  for (uint32_t b = 0; uint64_t{b} * block_tokens < tokens; ++b) {
    uint32_t first = b * block_tokens;
    uint32_t last = std::min(tokens, first + block_tokens);
    bool ok = b < hashes.size();
    for (uint32_t l = 0; ok && l < layers; ++l)
      for (uint32_t t = first; ok && t < last; ++t)
        ok =
            storage::kv_check_token(hashes[b], l, t - first,
                                    slot + slot_offset(l, tokens, t, bpt), bpt);
    if (ok)
      ++result.blocks_ok;
    else
      ++result.blocks_failed;
  }
  return result;
}

const std::byte* lease_payload(const buffer_lease& lease,
                               uint64_t payload_bytes) {
  auto p = reinterpret_cast<const std::byte*>(lease.region.base)
           + lease.region.offset;
  if (lease.region.length >= transport::storage::header_bytes + payload_bytes)
    p += transport::storage::header_bytes;
  return p;
}

gpu::segment_grid slot_grid(uint32_t block_tokens, uint32_t layers,
                            uint32_t tokens, size_t bpt) {
  gpu::segment_grid g;
  g.rows = layers;
  g.row_bytes = size_t{tokens} * bpt;
  g.row_stride = g.row_bytes;
  g.segment_bytes = size_t{block_tokens} * bpt;
  return g;
}

std::vector<uint64_t>
slot_checksums(const std::vector<transport::block_hash>& hashes,
               uint32_t block_tokens, uint32_t layers, uint32_t tokens,
               size_t bpt) {
  auto grid = slot_grid(block_tokens, layers, tokens, bpt);
  std::vector<uint64_t> out(grid.count());
  std::vector<std::byte> block(grid.segment_bytes);
  const size_t blocks = grid.segments_per_row();
  for (uint32_t l = 0; l < layers; ++l)
    for (size_t b = 0; b < blocks && b < hashes.size(); ++b) {
      auto first = static_cast<uint32_t>(b * block_tokens);
      auto last = std::min(tokens, first + block_tokens);
      fill_tokens(hashes, block_tokens, l, first, last, bpt, block.data());
      out[l * blocks + b] =
          gpu::block_checksum(block.data(), size_t{last - first} * bpt);
    }
  return out;
}

slot_check check_slot_checksums(const std::vector<uint64_t>& expected,
                                const uint64_t* actual, uint32_t layers,
                                size_t hashes) {
  slot_check result;
  const size_t blocks = layers == 0 ? 0 : expected.size() / layers;
  for (size_t b = 0; b < blocks; ++b) {
    bool ok = b < hashes;
    for (uint32_t l = 0; ok && l < layers; ++l)
      ok = actual[l * blocks + b] == expected[l * blocks + b];
    if (ok)
      ++result.blocks_ok;
    else
      ++result.blocks_failed;
  }
  return result;
}

} // namespace dualpath::actors
