// ctest-label: engines
// coarsen() (`sim.layers_per_step`) and the compute model seen through an
// engine's config: k layers per step keep a token's KV bytes over the model
// (to the byte per step) and a group prefill step's total compute time
// (overhead included), leave decode untouched, and k = 1 changes nothing.
#include <doctest/doctest.h>

#include <cmath>

#include "actors/engines/engine_timing.hpp"
#include "gpu/compute_model.hpp"

using namespace dualpath::actors;

namespace {

engine_config ds_660b_engine() {
  auto m = dualpath::gpu::ds_660b();
  engine_config c;
  c.model.layers = m.layers;
  c.model.nominal_bytes_per_token_layer = m.kv_bytes_per_token_layer;
  c.model.real_bytes_per_token_layer = m.kv_bytes_per_token_layer;
  c.model.active_params = m.active_params;
  c.model.attn_heads = m.attention_heads;
  c.model.attn_qk_dim = m.qk_head_dim;
  c.model.attn_v_dim = m.v_head_dim;
  c.model.attn_topk = m.sparse_topk;
  c.model.indexer_heads = m.indexer_heads;
  c.model.indexer_dim = m.indexer_dim;
  c.gpu = dualpath::gpu::h200(0.5, 1.0);
  c.group_model.routed_share = 0.6;
  c.group_model.layer_overhead_s = 30e-6;
  c.group_model.weight_bytes_per_gpu = 21e9;
  c.group_model.curve = dualpath::gpu::efficiency_curve{
      {{300, 0.345}, {1500, 0.862}, {3000, 1.0}}};
  return c;
}

} // namespace

TEST_CASE("coarse steps keep bytes and compute, not the step count") {
  auto fine = ds_660b_engine();
  REQUIRE(fine.model.layers == 61);
  // Two GPUs of a group, the second with a smaller batch.
  std::vector<std::vector<dualpath::gpu::sequence_shape>> batch{
      {{30'000, 500}, {12'000, 2'000}}, {{8'000, 400}}};
  auto fine_total = fine.model.layers * prefill_step_layer(fine, batch).layer_s;
  for (uint32_t k : {2u, 4u, 8u, 61u, 100u}) {
    CAPTURE(k);
    auto coarse = fine;
    coarse.model = coarsen(fine.model, k, 656);
    auto steps = (61 + k - 1) / k;
    if (k > 61)
      steps = 1;
    CHECK(coarse.model.layers == steps);
    CHECK(coarse.model.layer_weight == doctest::Approx(61.0 / steps));
    // A token's KV over the whole model: the same to a byte per step.
    auto fine_bytes = 61.0 * 656;
    auto coarse_bytes = double(coarse.model.layers)
                        * double(coarse.model.nominal_bytes_per_token_layer);
    CHECK(std::abs(coarse_bytes - fine_bytes) <= steps);
    // One real byte per token and model layer at byte scale 656.
    CHECK(coarse.model.real_bytes_per_token_layer
          == (coarse.model.nominal_bytes_per_token_layer + 655) / 656);
    // The whole prefill takes as long; decode is not coarsened.
    auto coarse_total =
        coarse.model.layers * prefill_step_layer(coarse, batch).layer_s;
    CHECK(coarse_total == doctest::Approx(fine_total).epsilon(1e-9));
    std::vector<std::vector<uint64_t>> contexts{{40'000, 9'000}, {1'000}};
    CHECK(decode_step(coarse, contexts).tpot_s
          == doctest::Approx(decode_step(fine, contexts).tpot_s).epsilon(1e-6));
  }
  auto same = coarsen(fine.model, 1, 656);
  CHECK(same.layers == 61);
  CHECK(same.layer_weight == 1.0);
  CHECK(same.nominal_bytes_per_token_layer == 656);
}
