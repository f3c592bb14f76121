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

std::vector<block_segment> block_segments(uint32_t first, uint32_t count,
                                          uint32_t block_tokens) {
  std::vector<block_segment> out;
  if (block_tokens == 0)
    return out;
  uint32_t t = first;
  const uint32_t end = first + count;
  while (t < end) {
    block_segment seg;
    seg.block = t / block_tokens;
    seg.token_in_block = t % block_tokens;
    seg.tokens = std::min(end - t, block_tokens - seg.token_in_block);
    seg.first_token = t;
    out.push_back(seg);
    t += seg.tokens;
  }
  return out;
}

namespace {

uint32_t tokens_in_block(uint32_t block, uint32_t block_tokens,
                         uint32_t tokens) {
  uint64_t first = uint64_t{block} * block_tokens;
  if (first >= tokens)
    return 0;
  return static_cast<uint32_t>(
      std::min<uint64_t>(block_tokens, tokens - first));
}

} // namespace

bool check_block(const std::vector<transport::block_hash>& hashes,
                 uint32_t block, uint32_t block_tokens, uint32_t layers,
                 uint32_t tokens, size_t bpt, const std::byte* payload) {
  auto n = tokens_in_block(block, block_tokens, tokens);
  if (block >= hashes.size() || n == 0)
    return false;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t t = 0; t < n; ++t)
      if (!storage::kv_check_token(
              hashes[block], l, t,
              payload + block_offset(l, t, block_tokens, bpt), bpt))
        return false;
  return true;
}

void fill_block(const std::vector<transport::block_hash>& hashes,
                uint32_t block, uint32_t block_tokens, uint32_t layers,
                uint32_t tokens, size_t bpt, std::byte* payload) {
  auto n = tokens_in_block(block, block_tokens, tokens);
  if (block >= hashes.size())
    return;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t t = 0; t < n; ++t)
      storage::kv_fill_token(hashes[block], l, t,
                             payload + block_offset(l, t, block_tokens, bpt),
                             bpt);
}

const std::byte* lease_payload(const buffer_lease& lease,
                               uint64_t payload_bytes) {
  auto p = reinterpret_cast<const std::byte*>(lease.region.base)
           + lease.region.offset;
  if (lease.region.length >= transport::storage::header_bytes + payload_bytes)
    p += transport::storage::header_bytes;
  return p;
}

prompt_grids grids_of(uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                      size_t bpt) {
  prompt_grids g;
  const size_t layer_block = size_t{block_tokens} * bpt;
  const uint32_t full = block_tokens == 0 ? 0 : tokens / block_tokens;
  const uint32_t tail = tokens - full * block_tokens;
  g.full.rows = size_t{full} * layers;
  g.full.row_stride = layer_block;
  g.full.row_bytes = layer_block;
  g.full.segment_bytes = layer_block;
  if (tail > 0) {
    g.partial.offset = size_t{full} * layers * layer_block;
    g.partial.rows = layers;
    g.partial.row_stride = layer_block;
    g.partial.row_bytes = size_t{tail} * bpt;
    g.partial.segment_bytes = size_t{tail} * bpt;
  }
  return g;
}

std::vector<uint64_t>
prompt_checksums(const std::vector<transport::block_hash>& hashes,
                 uint32_t block_tokens, uint32_t layers, uint32_t tokens,
                 size_t bpt) {
  std::vector<uint64_t> out;
  std::vector<std::byte> buf(size_t{block_tokens} * bpt);
  const uint32_t blocks =
      block_tokens == 0 ? 0 : (tokens + block_tokens - 1) / block_tokens;
  for (uint32_t k = 0; k < blocks && k < hashes.size(); ++k) {
    auto first = k * block_tokens;
    auto n = std::min(tokens - first, block_tokens);
    for (uint32_t l = 0; l < layers; ++l) {
      fill_tokens(hashes, block_tokens, l, first, first + n, bpt, buf.data());
      out.push_back(gpu::block_checksum(buf.data(), size_t{n} * bpt));
    }
  }
  return out;
}

block_tally check_prompt_checksums(const std::vector<uint64_t>& expected,
                                   const uint64_t* actual, uint32_t layers,
                                   uint32_t blocks) {
  block_tally t;
  for (uint32_t k = 0; k < blocks; ++k) {
    bool ok = (size_t{k} + 1) * layers <= expected.size();
    for (uint32_t l = 0; ok && l < layers; ++l)
      ok = actual[size_t{k} * layers + l] == expected[size_t{k} * layers + l];
    if (ok)
      ++t.ok;
    else
      ++t.failed;
  }
  return t;
}

} // namespace dualpath::actors
