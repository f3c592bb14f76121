// ctest-label: engines
// How one prefill GPU packs its next batch: the compute quota packs FIFO
// while the predicted attention time fits and cuts the request that
// overflows by binary search; the token budget packs FIFO up to its new
// tokens and cuts the last request; either way the batch's resident KV stops
// at the GPU's free HBM (Basic: every layer resident), and a head request
// that can never fit is reported.
#include <doctest/doctest.h>

#include <numeric>

#include "actors/engines/prefill/packing.hpp"

using namespace dualpath::actors;

namespace {

// One second of attention per new token, whatever is cached: easy sums.
double per_token(uint64_t, uint64_t bsz) {
  return static_cast<double>(bsz);
}

std::vector<pack_candidate> requests(std::vector<uint64_t> remaining,
                                     uint64_t cached = 100) {
  std::vector<pack_candidate> out;
  uint64_t id = 1;
  for (auto r : remaining)
    out.push_back(pack_candidate{id++, cached, r});
  return out;
}

uint64_t new_tokens(const packed_batch& b) {
  uint64_t n = 0;
  for (auto& c : b.chunks)
    n += c.bsz;
  return n;
}

} // namespace

TEST_CASE("the quota packs FIFO and chunks the request that overflows") {
  pack_limits lim;
  lim.policy = batching::quota;
  lim.quota_s = 10; // 10 new tokens at 1 s each
  lim.hbm_bytes = uint64_t{1} << 40;
  auto b = pack_gpu_batch(requests({4, 3, 8, 2}), lim, per_token);
  REQUIRE_EQ(b.chunks.size(), 3u);
  CHECK_EQ(b.chunks[0].id, 1u);
  CHECK_EQ(b.chunks[0].bsz, 4u);
  CHECK_EQ(b.chunks[1].bsz, 3u);
  // Request 3 overflows: cut to the 3 tokens that still fit.
  CHECK_EQ(b.chunks[2].id, 3u);
  CHECK_EQ(b.chunks[2].bsz, 3u);
  CHECK_EQ(b.chunks[2].cached, 100u);
  double total = 0;
  for (auto& c : b.chunks)
    total += c.predicted_s;
  CHECK_EQ(total, doctest::Approx(10.0));
  CHECK_EQ(b.unfit, 0u);
  // A head request alone above the quota: one minimal chunk runs alone.
  lim.min_chunk = 2;
  auto alone = pack_gpu_batch(requests({50}), lim, [](uint64_t, uint64_t n) {
    return 100.0 * static_cast<double>(n);
  });
  REQUIRE_EQ(alone.chunks.size(), 1u);
  CHECK_EQ(alone.chunks[0].bsz, 2u);
}

TEST_CASE("the token budget packs FIFO and chunks the last request") {
  pack_limits lim;
  lim.policy = batching::token_budget;
  lim.batch_tokens = 10;
  lim.hbm_bytes = uint64_t{1} << 40;
  auto b = pack_gpu_batch(requests({4, 3, 8, 2}), lim, per_token);
  REQUIRE_EQ(b.chunks.size(), 3u);
  CHECK_EQ(new_tokens(b), 10u);
  CHECK_EQ(b.chunks[2].id, 3u);
  CHECK_EQ(b.chunks[2].bsz, 3u);
  // A request longer than the budget is cut to it.
  auto one = pack_gpu_batch(requests({25}), lim, per_token);
  REQUIRE_EQ(one.chunks.size(), 1u);
  CHECK_EQ(one.chunks[0].bsz, 10u);
}

TEST_CASE("Basic's batch stops at the free HBM; layerwise needs a window") {
  // Four requests of 100 cached + 10 new tokens: 110 tokens x 2 bytes each
  // per layer; 8 layers all resident (Basic) = 1760 bytes per request.
  pack_limits lim;
  lim.policy = batching::token_budget;
  lim.batch_tokens = 1000;
  lim.bpt = 2;
  lim.resident_layers = 8;
  lim.hbm_bytes = 3 * 1760 + 100; // room for three
  auto basic = pack_gpu_batch(requests({10, 10, 10, 10}), lim, per_token);
  CHECK_EQ(basic.chunks.size(), 3u);
  CHECK_EQ(basic.unfit, 0u);
  // Layerwise keeps a window of 2 layers: all four fit in the same HBM.
  lim.resident_layers = 2;
  auto layerwise = pack_gpu_batch(requests({10, 10, 10, 10}), lim, per_token);
  CHECK_EQ(layerwise.chunks.size(), 4u);
  // A first chunk that does not fit is cut to what does: 100 cached + 5 new
  // tokens in 8 layers = 1680 bytes of 1700.
  lim.resident_layers = 8;
  lim.hbm_bytes = 1700;
  auto cut = pack_gpu_batch(requests({10}), lim, per_token);
  REQUIRE_EQ(cut.chunks.size(), 1u);
  CHECK_EQ(cut.chunks[0].bsz, 6u); // (1700 - 1600) / 16 = 6 tokens
  // The cached KV alone exceeds the HBM: the request can never run here.
  lim.hbm_bytes = 1500;
  auto never = pack_gpu_batch(requests({10, 1}), lim, per_token);
  CHECK(never.chunks.empty());
  CHECK_EQ(never.unfit, 1u);
}
