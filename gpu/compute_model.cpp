#include "gpu/compute_model.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

// All arithmetic in double: token counts up to ~1e6 and FLOP counts up to
// ~1e18 are exact enough (53-bit mantissa) for times in nanoseconds.

namespace dualpath::gpu {

model_shape deepseek_v3() {
  model_shape m;
  m.name = "deepseek-v3";
  m.layers = 61;
  m.active_params = 37e9;
  m.attention_heads = 128;
  m.qk_head_dim = 576; // absorbed MLA: 512 latent + 64 rope
  m.v_head_dim = 512;
  m.kv_bytes_per_token_layer = 656; // 512 FP8 latent + 16 scales + 128 rope
  m.weight_bytes_per_param = 1;     // FP8
  return m;
}

model_shape ds_660b() {
  model_shape m = deepseek_v3();
  m.name = "ds-660b";
  m.sparse_topk = 2048;
  m.indexer_heads = 64;
  m.indexer_dim = 128;
  return m;
}

model_shape qwen25_32b() {
  model_shape m;
  m.name = "qwen2.5-32b";
  m.layers = 64;
  m.active_params = 32.5e9;
  m.attention_heads = 40;
  m.qk_head_dim = 128;
  m.v_head_dim = 128;
  m.kv_bytes_per_token_layer = 2 * 8 * 128 * 2; // K and V, 8 heads, FP16
  m.weight_bytes_per_param = 2;                 // BF16
  return m;
}

gpu_rate h200(double compute_efficiency, double hbm_efficiency) {
  return gpu_rate{"h200", 989.0, compute_efficiency, 4.8, hbm_efficiency, 0};
}

gpu_rate h100(double compute_efficiency, double hbm_efficiency) {
  return gpu_rate{"h100", 989.0, compute_efficiency, 3.35, hbm_efficiency, 0};
}

std::string validate(const model_shape& m) {
  if (m.layers == 0)
    return "model " + m.name + ": layers must be > 0";
  if (!(m.active_params > 0))
    return "model " + m.name + ": active_params must be > 0";
  if (m.attention_heads == 0 || m.qk_head_dim == 0 || m.v_head_dim == 0)
    return "model " + m.name + ": attention heads and head dims must be > 0";
  if (m.kv_bytes_per_token_layer == 0)
    return "model " + m.name + ": kv_bytes_per_token_layer must be > 0";
  if (!(m.weight_bytes_per_param > 0))
    return "model " + m.name + ": weight_bytes_per_param must be > 0";
  if (m.sparse_topk > 0 && (m.indexer_heads == 0 || m.indexer_dim == 0))
    return "model " + m.name
           + ": sparse attention needs indexer heads and dims > 0";
  return {};
}

std::string validate(const gpu_rate& g) {
  if (!(g.tflops > 0))
    return "gpu " + g.name + ": tflops must be > 0";
  if (!(g.compute_efficiency > 0 && g.compute_efficiency <= 1))
    return "gpu " + g.name + ": compute_efficiency must be in (0, 1]";
  if (!(g.hbm_tbps > 0))
    return "gpu " + g.name + ": hbm_tbps must be > 0";
  if (!(g.hbm_efficiency > 0 && g.hbm_efficiency <= 1))
    return "gpu " + g.name + ": hbm_efficiency must be in (0, 1]";
  if (!(g.step_overhead_s >= 0))
    return "gpu " + g.name + ": step_overhead_s must be >= 0";
  return {};
}

double attention_pairs(const sequence_shape& s) {
  const double n = static_cast<double>(s.new_tokens);
  const double c = static_cast<double>(s.cached);
  return n * c + n * (n + 1) / 2;
}

double sparse_attention_pairs(const sequence_shape& s, uint32_t topk) {
  if (topk == 0)
    return attention_pairs(s);
  // New token t (1-based) sees c + t keys; it attends to min(c + t, k).
  const double n = static_cast<double>(s.new_tokens);
  const double c = static_cast<double>(s.cached);
  const double k = topk;
  // Tokens with c + t <= k: t <= k - c.
  const double below = std::clamp(k - c, 0.0, n);
  const double dense_part = below * c + below * (below + 1) / 2;
  return dense_part + (n - below) * k;
}

namespace {

// Main attention plus, for sparse attention, the indexer.
double layer_attention_flops(const model_shape& m, double dense_pairs,
                             double main_pairs) {
  double f = attention_flops_for_pairs(m, main_pairs);
  if (m.sparse_topk > 0)
    f += 2.0 * m.indexer_heads * static_cast<double>(m.indexer_dim)
         * dense_pairs;
  return f;
}

} // namespace

double linear_flops_per_layer(const model_shape& m, uint64_t tokens) {
  return 2.0 * (m.active_params / m.layers) * static_cast<double>(tokens);
}

double attention_flops_for_pairs(const model_shape& m, double pairs) {
  return 2.0 * m.attention_heads
         * (static_cast<double>(m.qk_head_dim) + m.v_head_dim) * pairs;
}

double attention_flops_per_layer(const model_shape& m,
                                 const std::vector<sequence_shape>& batch) {
  double dense = 0;
  double main = 0;
  for (const auto& s : batch) {
    dense += attention_pairs(s);
    main += sparse_attention_pairs(s, m.sparse_topk);
  }
  return layer_attention_flops(m, dense, main);
}

double cache_to_compute_gb_per_pflop(const model_shape& m,
                                     const sequence_shape& s) {
  const double flops = m.layers * prefill_flops_per_layer(m, {s});
  const double bytes = static_cast<double>(s.cached) * m.layers
                       * static_cast<double>(m.kv_bytes_per_token_layer);
  return flops > 0 ? (bytes / 1e9) / (flops / 1e15) : 0;
}

double prefill_flops_per_layer(const model_shape& m,
                               const std::vector<sequence_shape>& batch) {
  uint64_t tokens = 0;
  for (const auto& s : batch)
    tokens += s.new_tokens;
  return linear_flops_per_layer(m, tokens)
         + attention_flops_per_layer(m, batch);
}

namespace {

double flop_rate(const gpu_rate& g) {
  return g.tflops * 1e12 * g.compute_efficiency;
}

double byte_rate(const gpu_rate& g) {
  return g.hbm_tbps * 1e12 * g.hbm_efficiency;
}

} // namespace

double prefill_layer_seconds(const model_shape& m, const gpu_rate& g,
                             const std::vector<sequence_shape>& batch) {
  return prefill_flops_per_layer(m, batch) / flop_rate(g);
}

double attention_layer_seconds(const model_shape& m, const gpu_rate& g,
                               const std::vector<sequence_shape>& batch) {
  return attention_flops_per_layer(m, batch) / flop_rate(g);
}

decode_step decode_step_time(const model_shape& m, const gpu_rate& g,
                             const std::vector<uint64_t>& contexts) {
  decode_step r;
  if (contexts.empty())
    return r;
  double pairs = 0;
  double main = 0;
  for (auto c : contexts) {
    const double keys = static_cast<double>(c) + 1; // attends to itself too
    pairs += keys;
    main += m.sparse_topk > 0 ? std::min<double>(keys, m.sparse_topk) : keys;
  }
  const double flops = linear_flops_per_layer(m, contexts.size())
                       + layer_attention_flops(m, pairs, main);
  r.compute_s = flops / flop_rate(g);
  // KV read per layer: the rows attention reads (sparse: the selected ones
  // plus one FP8 indexer key per present token), plus the new one.
  double kv = main * static_cast<double>(m.kv_bytes_per_token_layer);
  if (m.sparse_topk > 0)
    kv += pairs * static_cast<double>(m.indexer_dim);
  const double bytes =
      m.active_params / m.layers * m.weight_bytes_per_param + kv;
  r.memory_s = bytes / byte_rate(g);
  r.layer_s = std::max(r.compute_s, r.memory_s);
  r.tpot_s = m.layers * r.layer_s + g.step_overhead_s;
  return r;
}

double efficiency_curve::at(double tokens) const {
  if (points.empty())
    return 1.0;
  if (tokens <= points.front().first)
    return points.front().second * std::max(tokens, 0.0) / points.front().first;
  for (size_t i = 1; i < points.size(); ++i)
    if (tokens <= points[i].first) {
      auto [x0, y0] = points[i - 1];
      auto [x1, y1] = points[i];
      return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0);
    }
  return points.back().second;
}

std::string validate(const efficiency_curve& c) {
  double last = 0;
  for (auto& [tokens, rel] : c.points) {
    if (!(tokens > last))
      return "efficiency curve: token counts must be > 0 and increasing";
    if (!(rel > 0 && rel <= 1))
      return "efficiency curve: relative efficiencies must be in (0, 1]";
    last = tokens;
  }
  return {};
}

std::string validate(const group_params& p) {
  if (auto why = validate(p.curve); !why.empty())
    return why;
  if (!(p.routed_share >= 0 && p.routed_share <= 1))
    return "routed expert share must be in [0, 1]";
  if (!(p.layer_overhead_s >= 0))
    return "layer overhead must be >= 0";
  if (!(p.weight_bytes_per_gpu >= 0))
    return "weight bytes per GPU must be >= 0";
  return {};
}

namespace {

// Linear FLOPs one GPU computes for its `own` new tokens of the group's
// `group_tokens` on `gpus` GPUs (routed experts spread evenly), split into
// the GPU's own part and its share of the routed experts.
std::pair<double, double> linear_split(const model_shape& m,
                                       const group_params& p, uint64_t own,
                                       uint64_t group_tokens, size_t gpus) {
  double per_token = linear_flops_per_layer(m, 1);
  double mine = (1 - p.routed_share) * per_token * static_cast<double>(own);
  double routed = p.routed_share * per_token * static_cast<double>(group_tokens)
                  / static_cast<double>(std::max<size_t>(gpus, 1));
  return {mine, routed};
}

} // namespace

group_layer prefill_step_layer_time(
    const model_shape& m, const gpu_rate& g, const group_params& p,
    const std::vector<std::vector<sequence_shape>>& per_gpu) {
  group_layer out;
  uint64_t group_tokens = 0;
  for (auto& batch : per_gpu)
    for (auto& s : batch)
      group_tokens += s.new_tokens;
  out.gpu_s.assign(per_gpu.size(), 0.0);
  if (group_tokens == 0)
    return out;
  const double peak = flop_rate(g);
  const double routed_tokens =
      static_cast<double>(group_tokens) / static_cast<double>(per_gpu.size());
  for (size_t i = 0; i < per_gpu.size(); ++i) {
    uint64_t own = 0;
    for (auto& s : per_gpu[i])
      own += s.new_tokens;
    auto [mine, routed] = linear_split(m, p, own, group_tokens, per_gpu.size());
    double t = routed / (peak * p.curve.at(routed_tokens));
    if (own > 0)
      t += (mine + attention_flops_per_layer(m, per_gpu[i]))
           / (peak * p.curve.at(static_cast<double>(own)));
    out.gpu_s[i] = t;
    out.slowest_s = std::max(out.slowest_s, t);
  }
  out.layer_s = out.slowest_s + p.layer_overhead_s;
  return out;
}

group_decode_step
decode_group_step_time(const model_shape& m, const gpu_rate& g,
                       const group_params& p,
                       const std::vector<std::vector<uint64_t>>& contexts) {
  group_decode_step out;
  uint64_t group_tokens = 0;
  for (auto& c : contexts)
    group_tokens += c.size();
  out.gpus.resize(contexts.size());
  if (group_tokens == 0)
    return out;
  double slowest = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    auto& r = out.gpus[i];
    double pairs = 0;
    double main = 0;
    for (auto c : contexts[i]) {
      const double keys = static_cast<double>(c) + 1; // attends to itself
      pairs += keys;
      main += m.sparse_topk > 0 ? std::min<double>(keys, m.sparse_topk) : keys;
    }
    auto [mine, routed] =
        linear_split(m, p, contexts[i].size(), group_tokens, contexts.size());
    r.compute_s =
        (mine + routed + layer_attention_flops(m, pairs, main)) / flop_rate(g);
    double kv = main * static_cast<double>(m.kv_bytes_per_token_layer);
    if (m.sparse_topk > 0)
      kv += pairs * static_cast<double>(m.indexer_dim);
    r.memory_s = (p.weight_bytes_per_gpu / m.layers + kv) / byte_rate(g);
    r.layer_s = std::max(r.compute_s, r.memory_s);
    r.tpot_s = m.layers * r.layer_s + g.step_overhead_s;
    slowest = std::max(slowest, r.layer_s);
  }
  out.layer_s = slowest + p.layer_overhead_s;
  out.tpot_s = m.layers * out.layer_s + g.step_overhead_s;
  return out;
}

double attention_seconds(const model_shape& m, const gpu_rate& g,
                         const sequence_shape& s) {
  return m.layers * attention_flops_per_layer(m, {s}) / flop_rate(g);
}

std::chrono::nanoseconds to_duration(double seconds) {
  return std::chrono::nanoseconds{
      static_cast<int64_t>(std::llround(seconds * 1e9))};
}

} // namespace dualpath::gpu
