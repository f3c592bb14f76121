// ctest-label: engines
// The FLOP compute model against numbers worked out by hand.
#include <doctest/doctest.h>

#include "gpu/compute_model.hpp"

using namespace dualpath::gpu;

namespace {

// The hand-worked cases below use DeepSeek-V3's dense MLA in its
// non-absorbed prefill form (qk 192 = 128 nope + 64 rope, v 128).
model_shape hand_model() {
  auto m = deepseek_v3();
  m.qk_head_dim = 192;
  m.v_head_dim = 128;
  return m;
}

} // namespace

TEST_CASE(
    "compute model: dense MLA prefill of 429 new tokens over 32k cached") {
  // By hand, per layer (61 layers, 37e9 active params, MLA 128 heads,
  // qk 192, v 128):
  //   linear    = 2 * (37e9 / 61) * 429
  //             = 2 * 606,557,377.05 * 429        = 520,426,229,508.2 FLOPs
  //   pairs     = 429 * 32,768 + 429 * 430 / 2
  //             = 14,057,472 + 92,235             = 14,149,707
  //   attention = 2 * 128 * (192 + 128) * pairs
  //             = 81,920 * 14,149,707             = 1,159,143,997,440 FLOPs
  //   total     = 1,679,570,226,948.2 FLOPs
  // At an H200's 989 TFLOP/s with 50% efficiency (494.5e12 FLOP/s):
  //   layer     = 1,679,570,226,948.2 / 494.5e12  = 3.39650 ms
  //   61 layers = 207.187 ms
  const auto m = hand_model();
  const auto g = h200(0.5);
  REQUIRE(validate(m).empty());
  REQUIRE(validate(g).empty());
  const std::vector<sequence_shape> batch{{32768, 429}};
  CHECK_EQ(attention_pairs(batch[0]), doctest::Approx(14149707.0));
  CHECK_EQ(linear_flops_per_layer(m, 429),
           doctest::Approx(520426229508.2).epsilon(1e-12));
  CHECK_EQ(attention_flops_per_layer(m, batch),
           doctest::Approx(1159143997440.0).epsilon(1e-12));
  CHECK_EQ(prefill_flops_per_layer(m, batch),
           doctest::Approx(1679570226948.2).epsilon(1e-12));
  CHECK_EQ(prefill_layer_seconds(m, g, batch),
           doctest::Approx(3.39650e-3).epsilon(1e-5));
  CHECK_EQ(m.layers * prefill_layer_seconds(m, g, batch),
           doctest::Approx(0.207187).epsilon(1e-5));
  CHECK_EQ(to_duration(prefill_layer_seconds(m, g, batch)).count(), 3396502);
}

TEST_CASE("compute model: a batch adds up its requests; causality counts") {
  const auto m = hand_model();
  const auto g = h200();
  // Attention of a batch is the sum of its requests' attention; linear work
  // only depends on the total number of new tokens.
  std::vector<sequence_shape> a{{1000, 100}};
  std::vector<sequence_shape> b{{0, 50}};
  std::vector<sequence_shape> ab{{1000, 100}, {0, 50}};
  CHECK_EQ(attention_flops_per_layer(m, ab),
           doctest::Approx(attention_flops_per_layer(m, a)
                           + attention_flops_per_layer(m, b)));
  CHECK_EQ(prefill_flops_per_layer(m, ab),
           doctest::Approx(linear_flops_per_layer(m, 150)
                           + attention_flops_per_layer(m, ab)));
  // No cache: n(n+1)/2 pairs (causal), not n^2.
  CHECK_EQ(attention_pairs({0, 4}), 10.0);
  // One new token over c cached attends to c + 1 keys.
  CHECK_EQ(attention_pairs({99, 1}), 100.0);
  // More cached tokens cost more attention, never less.
  CHECK(attention_layer_seconds(m, g, {{64000, 429}})
        > attention_layer_seconds(m, g, {{16000, 429}}));
  CHECK_EQ(prefill_layer_seconds(m, g, {}), 0.0);
}

TEST_CASE("compute model: decode TPOT of dense MLA, 32 sequences at 32k") {
  // By hand, per layer, batch 32, each with 32,768 tokens present:
  //   linear  = 2 * 606,557,377.05 * 32            = 38,819,672,131.1 FLOPs
  //   pairs   = 32 * 32,769                        = 1,048,608
  //   attn    = 81,920 * 1,048,608                 = 85,901,967,360 FLOPs
  //   compute = 124,721,639,491.1 / 989e12         = 126.109 us
  //   bytes   = 606,557,377.05 (FP8 weights) + 1,048,608 * 656
  //           = 606,557,377.05 + 687,886,848       = 1,294,444,225.05 B
  //   memory  = bytes / 4.8e12                     = 269.676 us  (bound)
  //   TPOT    = 61 * 269.676 us                    = 16.4502 ms
  // On an H100 (3.35 TB/s): 61 * bytes / 3.35e12   = 23.5705 ms.
  const auto m = hand_model();
  const std::vector<uint64_t> contexts(32, 32768);
  auto step = decode_step_time(m, h200(), contexts);
  CHECK_EQ(step.compute_s, doctest::Approx(126.109e-6).epsilon(1e-5));
  CHECK_EQ(step.memory_s, doctest::Approx(269.676e-6).epsilon(1e-5));
  CHECK_EQ(step.layer_s, step.memory_s);
  CHECK_EQ(step.tpot_s, doctest::Approx(16.4502e-3).epsilon(1e-5));
  auto slower = decode_step_time(m, h100(), contexts);
  CHECK_EQ(slower.tpot_s, doctest::Approx(23.5705e-3).epsilon(1e-5));
  // Overhead is added once per step; an empty batch costs nothing.
  auto g = h200();
  g.step_overhead_s = 1e-3;
  CHECK_EQ(decode_step_time(m, g, contexts).tpot_s,
           doctest::Approx(17.4502e-3).epsilon(1e-5));
  CHECK_EQ(decode_step_time(m, g, {}).tpot_s, 0.0);
}

TEST_CASE("compute model: the roofline switches to compute for big batches") {
  // Short contexts and a huge batch: linear FLOPs dominate the step.
  const auto m = hand_model();
  const std::vector<uint64_t> contexts(4096, 16);
  auto step = decode_step_time(m, h200(0.5), contexts);
  CHECK(step.compute_s > step.memory_s);
  CHECK_EQ(step.layer_s, step.compute_s);
}

TEST_CASE("compute model: sparse attention pairs and FLOPs by hand") {
  // top-k 4, 3 cached, 3 new: token 1 sees 4 keys (<= k), tokens 2 and 3 see
  // 5 and 6 but attend to 4 each: 4 + 4 + 4 = 12; dense: 3*3 + 3*4/2 = 15.
  CHECK_EQ(sparse_attention_pairs({3, 3}, 4), 12.0);
  CHECK_EQ(attention_pairs({3, 3}), 15.0);
  // No cache, 6 new, k 4: 1 + 2 + 3 + 4 + 4 + 4 = 18.
  CHECK_EQ(sparse_attention_pairs({0, 6}, 4), 18.0);
  // Under the limit nothing changes; topk 0 is dense.
  CHECK_EQ(sparse_attention_pairs({10, 5}, 100), attention_pairs({10, 5}));
  CHECK_EQ(sparse_attention_pairs({10, 5}, 0), attention_pairs({10, 5}));
  // ds-660b, 429 new over 32,768 cached, per layer:
  //   main    = 2 * 128 * (576 + 512) * 429 * 2048 = 244,712,816,640 (sic:
  //             278,528 * 878,592)
  //   indexer = 2 * 64 * 128 * 14,149,707       = 231,828,799,488
  const auto m = ds_660b();
  REQUIRE(validate(m).empty());
  CHECK_EQ(sparse_attention_pairs({32768, 429}, 2048), 878592.0);
  CHECK_EQ(
      attention_flops_per_layer(m, {{32768, 429}}),
      doctest::Approx(278528.0 * 878592 + 16384.0 * 14149707).epsilon(1e-12));
  auto bad = m;
  bad.indexer_heads = 0;
  CHECK_FALSE(validate(bad).empty());
}

TEST_CASE("compute model: cache-to-compute ratios of the brief") {
  // Brief section 1, 429-token append, 16k..64k context: DeepSeek-V3.2 660B
  // 13..36 GB/PFLOP (22 at 32.7k), DeepSeek-V3 4.8..5.8. The model must land
  // within 15% of each (the brief's exact token counts are not given).
  auto at = [](const model_shape& m, uint64_t context) {
    return cache_to_compute_gb_per_pflop(m, {context - 429, 429});
  };
  const auto v32 = ds_660b();
  CHECK_EQ(at(v32, 16384), doctest::Approx(13).epsilon(0.15));
  CHECK_EQ(at(v32, 32700), doctest::Approx(22).epsilon(0.15));
  CHECK_EQ(at(v32, 65536), doctest::Approx(36).epsilon(0.15));
  const auto v3 = deepseek_v3();
  CHECK_EQ(at(v3, 16384), doctest::Approx(4.8).epsilon(0.15));
  CHECK_EQ(at(v3, 65536), doctest::Approx(5.8).epsilon(0.15));
  // Sparse attention makes the same prompt ~4x cheaper to compute at 32.7k,
  // which is what turns agentic prefill I/O-bound.
  CHECK(at(v32, 32700) > 3.5 * at(v3, 32700));
}

TEST_CASE("compute model: presets and validation") {
  auto q = qwen25_32b();
  CHECK(validate(q).empty());
  CHECK_EQ(q.kv_bytes_per_token_layer * q.layers, 256u * 1024u); // 256 KiB
  CHECK_EQ(ds_660b().kv_bytes_per_token_layer * 61, 40016u);     // ~40 KB
  auto bad = ds_660b();
  bad.layers = 0;
  CHECK_FALSE(validate(bad).empty());
  auto slow = h100();
  slow.compute_efficiency = 1.5;
  CHECK_FALSE(validate(slow).empty());
  slow.compute_efficiency = 0.4;
  CHECK(validate(slow).empty());
}

namespace {

// A toy model whose numbers are easy to work by hand: 2 layers, linear
// FLOPs 2 * active / layers per token, attention 2 * 1 * (1 + 1) = 4 FLOPs
// per (query, key) pair, 100 B of KV per token per layer.
model_shape toy(double active_params) {
  model_shape m;
  m.name = "toy";
  m.layers = 2;
  m.active_params = active_params;
  m.attention_heads = 1;
  m.qk_head_dim = 1;
  m.v_head_dim = 1;
  m.kv_bytes_per_token_layer = 100;
  return m;
}

// 1 TFLOP/s, 1 GB/s of HBM, both fully achieved.
gpu_rate toy_gpu() {
  return gpu_rate{"toy", 1.0, 1.0, 0.001, 1.0, 0};
}

} // namespace

TEST_CASE("efficiency curve: linear between points, flat after, constant "
          "time below") {
  efficiency_curve c{{{300, 0.4}, {1500, 0.8}, {6000, 1.0}}};
  CHECK(validate(c).empty());
  CHECK_EQ(c.at(300), doctest::Approx(0.4));
  CHECK_EQ(c.at(900), doctest::Approx(0.6));
  CHECK_EQ(c.at(1500), doctest::Approx(0.8));
  CHECK_EQ(c.at(3750), doctest::Approx(0.9));
  CHECK_EQ(c.at(60000), doctest::Approx(1.0));
  // 150 tokens take as long as 300 do: half the efficiency.
  CHECK_EQ(c.at(150), doctest::Approx(0.2));
  CHECK_EQ(efficiency_curve{}.at(7), 1.0);
  CHECK_FALSE(validate(efficiency_curve{{{300, 0.4}, {200, 0.8}}}).empty());
  CHECK_FALSE(validate(efficiency_curve{{{300, 1.2}}}).empty());
}

TEST_CASE("a prefill step's layer lasts as long as its slowest GPU") {
  auto m = toy(2e9); // 2e9 linear FLOPs per token per layer
  group_params p;
  p.routed_share = 0.5;
  p.layer_overhead_s = 0.001;
  // GPU 0: 10 new tokens over 1000 cached: 10 * 1000 + 10 * 11 / 2 = 10055
  // pairs = 40220 attention FLOPs; GPU 1: 2 new tokens, 3 pairs = 12 FLOPs.
  // Routed experts: 0.5 * 2e9 * 12 tokens / 2 GPUs = 6e9 FLOPs on each.
  // GPU 0: (6e9 + 0.5 * 2e9 * 10 + 40220) / 1e12 = 0.01600004022 s
  // GPU 1: (6e9 + 0.5 * 2e9 * 2 + 12) / 1e12 = 0.008000000012 s
  auto step =
      prefill_step_layer_time(m, toy_gpu(), p, {{{1000, 10}}, {{0, 2}}});
  REQUIRE_EQ(step.gpu_s.size(), 2u);
  CHECK_EQ(step.gpu_s[0], doctest::Approx(0.01600004022).epsilon(1e-12));
  CHECK_EQ(step.gpu_s[1], doctest::Approx(0.008000000012).epsilon(1e-12));
  CHECK_EQ(step.slowest_s, step.gpu_s[0]);
  CHECK_EQ(step.layer_s, doctest::Approx(0.01700004022).epsilon(1e-12));
  // An idle GPU still computes its share of the routed experts, and the
  // group's layer is the slowest GPU's whichever GPU holds the big batch.
  auto idle = prefill_step_layer_time(m, toy_gpu(), p, {{}, {{1000, 10}}});
  CHECK_EQ(idle.gpu_s[0], doctest::Approx(0.5 * 2e9 * 10 / 2 / 1e12));
  CHECK_EQ(idle.layer_s,
           doctest::Approx((5e9 + 1e10 + 40220) / 1e12 + 0.001).epsilon(1e-12));
  // The efficiency curve: GPU 1's 2 tokens run at 2/10 of the peak.
  p.curve = efficiency_curve{{{10, 1.0}}};
  auto curved =
      prefill_step_layer_time(m, toy_gpu(), p, {{{1000, 10}}, {{0, 2}}});
  // Routed part at curve(6 tokens) = 0.6: 6e9 / 0.6e12 = 0.01 s.
  CHECK_EQ(curved.gpu_s[0], doctest::Approx(0.01 + 0.01000004022));
  CHECK_EQ(curved.gpu_s[1], doctest::Approx(0.01 + (2e9 + 12) / 0.2e12));
  CHECK_EQ(prefill_step_layer_time(m, toy_gpu(), p, {{}, {}}).layer_s, 0.0);
}

TEST_CASE("a decode step: roofline of weights and KV reads against FLOPs") {
  auto m = toy(2e6); // 2e6 linear FLOPs per token per layer
  group_params p;
  p.weight_bytes_per_gpu = 1e6; // 5e5 B per layer
  p.layer_overhead_s = 1e-4;
  // Batch 1, context 999: 1000 keys, KV read 1000 * 100 = 1e5 B; memory
  // (5e5 + 1e5) / 1e9 = 6e-4 s; compute (2e6 + 4 * 1000) / 1e12 = 2.004e-6
  // s: memory-bound. Layer 6e-4 + 1e-4 = 7e-4 s, TPOT 2 layers = 1.4e-3 s.
  auto one = decode_group_step_time(m, toy_gpu(), p, {{999}});
  CHECK_EQ(one.gpus[0].memory_s, doctest::Approx(6e-4));
  CHECK_EQ(one.gpus[0].compute_s, doctest::Approx(2.004e-6));
  CHECK_EQ(one.layer_s, doctest::Approx(7e-4));
  CHECK_EQ(one.tpot_s, doctest::Approx(1.4e-3));
  // Batch 4 of the same: KV 4e5 B, memory 9e-4 s; layer 1e-3, TPOT 2e-3 s:
  // TPOT grows with the batch, the weights are read once for all.
  auto four = decode_group_step_time(m, toy_gpu(), p, {{999, 999, 999, 999}});
  CHECK_EQ(four.gpus[0].memory_s, doctest::Approx(9e-4));
  CHECK_EQ(four.tpot_s, doctest::Approx(2e-3));
  // A group step lasts as long as its slowest GPU: GPU 1 with the batch of
  // 4 sets it although GPU 0 decodes a single sequence.
  auto both =
      decode_group_step_time(m, toy_gpu(), p, {{999}, {999, 999, 999, 999}});
  CHECK_EQ(both.tpot_s, doctest::Approx(2e-3));
  // Compute-bound at a large batch of short contexts: 1000 sequences of
  // context 0 (1 key each): KV 1000 * 100 B; memory (5e5 + 1e5) / 1e9 =
  // 6e-4 s; compute 1000 * (2e6 + 4) / 1e12 = 2.000004e-3 s.
  auto wide =
      decode_group_step_time(m, toy_gpu(), p, {std::vector<uint64_t>(1000, 0)});
  CHECK_EQ(wide.gpus[0].compute_s, doctest::Approx(2.000004e-3));
  CHECK_EQ(wide.layer_s, doctest::Approx(2.000004e-3 + 1e-4));
  // Sparse attention reads the top-k keys plus every key's indexer entry.
  auto s = m;
  s.sparse_topk = 100;
  s.indexer_heads = 1;
  s.indexer_dim = 8;
  auto sparse = decode_group_step_time(s, toy_gpu(), p, {{999}});
  // KV: 100 * 100 B + 1000 * 8 B = 18000 B; memory (5e5 + 18000) / 1e9.
  CHECK_EQ(sparse.gpus[0].memory_s, doctest::Approx(5.18e-4));
}
