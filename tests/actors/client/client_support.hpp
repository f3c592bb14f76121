// What the kv_client suites share: prompts, polling a lookup until it
// answers, damaging a block's file in place.
#pragma once

#include <chrono>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "actors/client/kv_client.hpp"

namespace dualpath::test {

/// `blocks` Full Blocks of `block_tokens` tokens and one more token (a
/// partial block), the tokens counting up from salt x 1000.
inline std::vector<uint32_t>
client_prompt(uint32_t blocks, uint32_t block_tokens, uint32_t salt = 0) {
  std::vector<uint32_t> t(blocks * block_tokens + 1);
  std::iota(t.begin(), t.end(), salt * 1000);
  return t;
}

/// The stored prefix of `tokens`, polling the lookup until it answers.
inline actors::client::prefix_hit
lookup_hit(actors::client::kv_client& client,
           const std::vector<uint32_t>& tokens) {
  auto t = client.lookup(tokens);
  for (;;) {
    auto r = client.lookup_result(t);
    if (r) {
      REQUIRE(*r);
      return std::move(**r);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  }
}

/// XORs the byte at `at` of the file `path` with `mask` (a block damaged
/// in storage).
inline void flip_byte(const std::string& path, std::streamoff at, char mask) {
  std::fstream f{path, std::ios::in | std::ios::out | std::ios::binary};
  REQUIRE(f);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(at);
  f.write(&c, 1);
}

} // namespace dualpath::test
