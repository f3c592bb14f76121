// The compute model: how long a GPU takes for one layer of a prefill batch and
// for one decode step, from FLOP counts and HBM traffic. Engines do not compute
// anything real; they wait for these times on the actor clock (delayed
// messages), so the same engines run in real and in simulated time. Pure math
// on plain parameter structs: thread-safe, no state, no dependency on config/.
//
// Prefill, per layer (tokens = new tokens of the batch):
//   linear    = 2 * (active_params / layers) * tokens
//   attention = 2 * heads * (qk_dim + v_dim) * pairs,
//     pairs of one request (cached c, new n) = n * c + n * (n + 1) / 2
//     (every new token attends to all cached tokens and, causally, to the new
//     tokens up to and including itself; QK^T costs 2 * qk_dim and PV costs
//     2 * v_dim FLOPs per head per pair)
//   time      = (linear + attention) / (gpu_tflops * 1e12 * compute_efficiency)
// Sparse attention (DeepSeek-V3.2's DSA, sparse_topk > 0): a lightning
// indexer scores every (query, key) pair, 2 * indexer_heads * indexer_dim
// FLOPs per pair, and the main attention then attends to at most sparse_topk
// keys per query: pairs of one request = sum over its new tokens t of
// min(keys visible to t, sparse_topk). With dense attention (DeepSeek-V3,
// same MLA dims) a 32.7k-token agentic prompt costs ~4x the FLOPs: the
// brief's cache-to-compute ratios (DeepSeek-V3 4.8-5.8 GB/PFLOP, V3.2 13-36)
// come out of these formulas (tests/gpu/compute_model.cpp checks both).
//
// Decode step, per layer, for a batch of sequences each producing one token
// with `context` tokens of KV already present:
//   compute   = linear(tokens = batch) + attention(pairs = context + 1 each;
//               sparse: min(context + 1, topk) main pairs plus context + 1
//               indexer pairs) at the compute rate above
//   memory    = (active_params / layers * weight_bytes_per_param
//                + sum(context + 1) * kv_bytes_per_token_layer)
//               / (hbm_tbps * 1e12 * hbm_efficiency)
//   time      = max(compute, memory)   (roofline: the step is bound by the
//               slower of the two; they overlap on a GPU)
//   TPOT      = layers * time + step_overhead
//
// A prefill step of an expert-parallel group (prefill_step_layer_time): the
// group's GPUs run each layer together (attention data-parallel: every GPU
// its own requests; then the experts' all-to-all, which waits for all). Per
// layer, GPU g with n_g new tokens of the group's N on G GPUs computes
//   attention of its requests + (1 - routed_share) x linear(n_g)
//   + routed_share x linear(N / G)        (routed experts spread evenly)
// at tflops x compute_efficiency x curve(n_g) (curve: how a GPU's efficiency
// grows with the new tokens of its batch, brief 3 / Fig. 3 right; the routed
// part at curve(N / G)), and the layer lasts as long as the slowest GPU plus
// a per-layer overhead (the all-to-all synchronization):
//   layer = max_g t_g + layer_overhead_s.
// A decode step of such a group (decode_group_step_time): per GPU a roofline
// of its batch's FLOPs (the same routed-share split) against its HBM bytes
// (the weights one GPU holds, per layer, plus the KV its attention reads:
// dense: every present key; sparse: the top-k keys plus every key's indexer
// entry), the step's layer = max_g max(compute_g, memory_g) + overhead.
//
// Assumptions (deliberately simple, stated so results can be judged):
// - "active params" counts the parameters one token uses (MoE: shared +
//   routed experts actually selected), excluding embeddings' lookup cost; the
//   linear FLOPs are spread evenly over the layers.
// - Decode reads the active weights once per step for the whole batch. With
//   MoE and large batches more experts are touched, so this is a lower bound
//   on weight traffic.
// - Attention uses the query heads and the per-head qk / v dims of the model
//   (MLA: qk = nope + rope dims); KV bytes are the stored cache bytes.
// - No kernel launch, communication (expert parallel all-to-all) or
//   scheduling overheads beyond `step_overhead_s`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dualpath::gpu {

/// The shape of a model, as far as the compute model needs it.
struct model_shape {
  std::string name;
  /// Transformer layers.
  uint32_t layers = 0;
  /// Parameters one token activates, in all layers together.
  double active_params = 0;
  /// Query heads of attention.
  uint32_t attention_heads = 0;
  /// Per-head dimension of queries and keys (MLA: nope + rope).
  uint32_t qk_head_dim = 0;
  /// Per-head dimension of values.
  uint32_t v_head_dim = 0;
  /// KV-cache bytes per token per layer (one Layer Block row).
  uint64_t kv_bytes_per_token_layer = 0;
  /// Bytes per weight as stored (FP8: 1, BF16: 2).
  double weight_bytes_per_param = 1;
  /// Sparse attention: keys each query attends to at most (0 = dense).
  uint32_t sparse_topk = 0;
  /// Sparse attention: the indexer's heads and per-head dimension.
  uint32_t indexer_heads = 0;
  uint32_t indexer_dim = 0;
};

/// The rate of one GPU.
struct gpu_rate {
  std::string name;
  /// Peak dense TFLOP/s of the precision the model computes in.
  double tflops = 0;
  /// Fraction of the peak that is achieved (0, 1].
  double compute_efficiency = 1;
  /// HBM bandwidth in TB/s (1e12 bytes/s).
  double hbm_tbps = 0;
  /// Fraction of the HBM bandwidth achieved (0, 1].
  double hbm_efficiency = 1;
  /// Fixed cost added to each decode step (launches, sampling), seconds.
  double step_overhead_s = 0;
};

/// One request in a batch: `cached` tokens of KV present, `new_tokens` to
/// compute (the paper's (cached, bsz) pair).
struct sequence_shape {
  uint64_t cached = 0;
  uint64_t new_tokens = 0;
};

/// DeepSeek-V3.2 660B: 61 layers, 37e9 active params, MLA with 128 heads in
/// its absorbed form (qk 576 = 512 latent + 64 rope, v 512), DSA sparse
/// attention (top-2048 keys per query, indexer 64 heads x 128), 656 B of FP8
/// KV per token per layer, FP8 weights.
model_shape ds_660b();

/// DeepSeek-V3 (the dense predecessor): ds_660b() without sparse attention.
model_shape deepseek_v3();

/// Qwen2.5-32B: 64 layers, dense 32.5e9 params, 40 query heads of 128 dims,
/// GQA with 8 KV heads (256 KiB KV per token: 4 KiB per layer), BF16.
model_shape qwen25_32b();

/// H200: 989 dense BF16 TFLOP/s, 4.8 TB/s HBM3e.
gpu_rate h200(double compute_efficiency = 1, double hbm_efficiency = 1);

/// H100 SXM: 989 dense BF16 TFLOP/s, 3.35 TB/s HBM3.
gpu_rate h100(double compute_efficiency = 1, double hbm_efficiency = 1);

/// Empty when `m` is usable, else what is wrong.
std::string validate(const model_shape& m);

/// Empty when `g` is usable, else what is wrong.
std::string validate(const gpu_rate& g);

/// (query, key) pairs one layer's dense attention computes for `s`.
double attention_pairs(const sequence_shape& s);

/// (query, key) pairs of `s` when each query attends to at most `topk` keys
/// (topk 0 = dense: attention_pairs(s)).
double sparse_attention_pairs(const sequence_shape& s, uint32_t topk);

/// GB (1e9 bytes) of cached KV to load per PFLOP of prefill for one request
/// (the brief's cache-to-compute ratio).
double cache_to_compute_gb_per_pflop(const model_shape& m,
                                     const sequence_shape& s);

/// Linear-layer FLOPs of one layer for `tokens` tokens.
double linear_flops_per_layer(const model_shape& m, uint64_t tokens);

/// Attention FLOPs of one layer for `pairs` (query, key) pairs.
double attention_flops_for_pairs(const model_shape& m, double pairs);

/// Attention FLOPs of one layer for a prefill batch.
double attention_flops_per_layer(const model_shape& m,
                                 const std::vector<sequence_shape>& batch);

/// All FLOPs of one layer for a prefill batch.
double prefill_flops_per_layer(const model_shape& m,
                               const std::vector<sequence_shape>& batch);

/// Seconds one layer of a prefill batch takes.
double prefill_layer_seconds(const model_shape& m, const gpu_rate& g,
                             const std::vector<sequence_shape>& batch);

/// Seconds attention alone takes in one layer (the intra-engine scheduler
/// balances this across data-parallel GPUs).
double attention_layer_seconds(const model_shape& m, const gpu_rate& g,
                               const std::vector<sequence_shape>& batch);

/// The terms of one decode step.
struct decode_step {
  /// Compute-bound time of one layer, seconds.
  double compute_s = 0;
  /// Memory-bound time of one layer (weights + KV at HBM bandwidth), seconds.
  double memory_s = 0;
  /// max(compute_s, memory_s).
  double layer_s = 0;
  /// layers * layer_s + step overhead: the time per output token.
  double tpot_s = 0;
};

/// One decode step for sequences whose present context lengths are
/// `contexts` (one new token each).
decode_step decode_step_time(const model_shape& m, const gpu_rate& g,
                             const std::vector<uint64_t>& contexts);

/// How a GPU's prefill efficiency grows with the new tokens of its batch:
/// points (new tokens, relative efficiency in (0, 1]) with increasing token
/// counts. Between points linear, from the last point on flat; below the
/// first point a batch takes as long as the first point's batch (a smaller
/// batch does not finish sooner), i.e. relative = first.second x tokens /
/// first.first. An empty curve is flat at 1.
struct efficiency_curve {
  std::vector<std::pair<double, double>> points;

  /// The relative efficiency at `tokens` new tokens (tokens > 0).
  double at(double tokens) const;
};

/// Empty when `c` is usable (token counts > 0 and increasing, relative
/// efficiencies in (0, 1]), else what is wrong.
std::string validate(const efficiency_curve& c);

/// The parts of a group step beyond one GPU's rate.
struct group_params {
  /// Relative prefill efficiency by a GPU's new tokens.
  efficiency_curve curve;
  /// Share of the linear FLOPs in routed experts, spread over the group's
  /// GPUs (0: a dense model, every GPU computes its own tokens' FLOPs).
  double routed_share = 0;
  /// Added to every layer of a step (the expert all-to-all's
  /// synchronization), seconds.
  double layer_overhead_s = 0;
  /// Weight bytes one GPU holds (decode reads them once per step).
  double weight_bytes_per_gpu = 0;
};

/// Empty when `p` is usable, else what is wrong.
std::string validate(const group_params& p);

/// One layer of a prefill step of an expert-parallel group (see the file
/// comment): every GPU's compute time and the layer's time.
struct group_layer {
  std::vector<double> gpu_s; ///< t_g per GPU, seconds.
  double slowest_s = 0;      ///< max_g t_g.
  double layer_s = 0;        ///< slowest_s + layer_overhead_s.
};

/// `per_gpu[g]` is GPU g's batch; a GPU with an empty batch still computes
/// its share of the routed experts. An empty group (no GPU or no token)
/// takes 0.
group_layer prefill_step_layer_time(
    const model_shape& m, const gpu_rate& g, const group_params& p,
    const std::vector<std::vector<sequence_shape>>& per_gpu);

/// One decode step of an expert-parallel group: `contexts[g]` lists the
/// present context of every sequence on GPU g (one new token each).
struct group_decode_step {
  std::vector<decode_step> gpus; ///< Each GPU's roofline terms.
  double layer_s = 0;            ///< max over GPUs + layer_overhead_s.
  double tpot_s = 0;             ///< layers x layer_s + g.step_overhead_s.
};

group_decode_step
decode_group_step_time(const model_shape& m, const gpu_rate& g,
                       const group_params& p,
                       const std::vector<std::vector<uint64_t>>& contexts);

/// Attention seconds of one request (cached, new) over all layers at the
/// GPU's full rate: what the intra-engine compute quota packs against.
double attention_seconds(const model_shape& m, const gpu_rate& g,
                         const sequence_shape& s);

/// Seconds as the actor clock's duration (rounded to the nearest ns).
std::chrono::nanoseconds to_duration(double seconds);

} // namespace dualpath::gpu
