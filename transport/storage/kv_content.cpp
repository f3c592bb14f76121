#include "transport/storage/kv_content.hpp"

#include <cstring>

#include <xxhash.h>

namespace dualpath::transport::storage {

namespace {

constexpr uint64_t golden = 0x9E3779B97F4A7C15ull;

inline uint64_t splitmix64(uint64_t x) {
  x += golden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seed of one token's KV stream: mixes hash, layer and position so that
// neighbouring tokens and layers get unrelated streams.
inline uint64_t token_seed(block_hash hash, uint32_t layer, uint32_t pos) {
  return splitmix64(hash ^ splitmix64((uint64_t{layer} << 32) | pos));
}

// Word i of a stream is splitmix64(seed + i * golden): counter-based, so
// ranges are independent. The last partial word is truncated.
template <class F>
void for_each_word(uint64_t seed, size_t bytes, F f) {
  size_t words = bytes / 8;
  uint64_t ctr = seed;
  for (size_t i = 0; i < words; ++i) {
    ctr += golden;
    f(i * 8, splitmix64(ctr), size_t{8});
  }
  if (auto rest = bytes % 8; rest != 0) {
    ctr += golden;
    f(words * 8, splitmix64(ctr), rest);
  }
}

} // namespace

block_hash chain_hash(block_hash parent, const uint32_t* tokens, size_t count) {
  // Token ids are hashed in little-endian order (the host order on every
  // supported platform).
  return XXH64(tokens, count * sizeof(uint32_t), parent);
}

std::vector<block_hash> block_hashes(const std::vector<uint32_t>& tokens,
                                     uint32_t block_tokens) {
  std::vector<block_hash> result;
  if (block_tokens == 0)
    return result;
  auto parent = root_hash;
  for (size_t i = 0; i + block_tokens <= tokens.size(); i += block_tokens) {
    parent = chain_hash(parent, tokens.data() + i, block_tokens);
    result.push_back(parent);
  }
  return result;
}

void kv_fill_token(block_hash hash, uint32_t layer, uint32_t position,
                   std::byte* dst, size_t bytes) {
  for_each_word(token_seed(hash, layer, position), bytes,
                [dst](size_t off, uint64_t w, size_t n) {
                  std::memcpy(dst + off, &w, n);
                });
}

void kv_fill_layer(block_hash hash, uint32_t layer, uint32_t tokens,
                   size_t bytes_per_token, std::byte* dst) {
  for (uint32_t t = 0; t < tokens; ++t)
    kv_fill_token(hash, layer, t, dst + t * bytes_per_token, bytes_per_token);
}

bool kv_check_token(block_hash hash, uint32_t layer, uint32_t position,
                    const std::byte* src, size_t bytes) {
  bool ok = true;
  for_each_word(token_seed(hash, layer, position), bytes,
                [&](size_t off, uint64_t w, size_t n) {
                  ok = ok && std::memcmp(src + off, &w, n) == 0;
                });
  return ok;
}

bool kv_check_layer(block_hash hash, uint32_t layer, uint32_t tokens,
                    size_t bytes_per_token, const std::byte* src) {
  for (uint32_t t = 0; t < tokens; ++t)
    if (!kv_check_token(hash, layer, t, src + t * bytes_per_token,
                        bytes_per_token))
      return false;
  return true;
}

} // namespace dualpath::transport::storage
