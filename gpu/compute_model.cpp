#include "gpu/compute_model.hpp"

#include <algorithm>
#include <cmath>

// All arithmetic in double: token counts up to ~1e6 and FLOP counts up to
// ~1e18 are exact enough (53-bit mantissa) for times in nanoseconds.

namespace dualpath::gpu {

model_shape ds_660b() {
  model_shape m;
  m.name = "ds-660b";
  m.layers = 61;
  m.active_params = 37e9;
  m.attention_heads = 128;
  m.qk_head_dim = 192; // 128 nope + 64 rope
  m.v_head_dim = 128;
  m.kv_bytes_per_token_layer = 656; // 512 FP8 latent + 16 scales + 128 rope
  m.weight_bytes_per_param = 1;     // FP8
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

double linear_flops_per_layer(const model_shape& m, uint64_t tokens) {
  return 2.0 * (m.active_params / m.layers) * static_cast<double>(tokens);
}

double attention_flops_for_pairs(const model_shape& m, double pairs) {
  return 2.0 * m.attention_heads
         * (static_cast<double>(m.qk_head_dim) + m.v_head_dim) * pairs;
}

double attention_flops_per_layer(const model_shape& m,
                                 const std::vector<sequence_shape>& batch) {
  double pairs = 0;
  for (const auto& s : batch)
    pairs += attention_pairs(s);
  return attention_flops_for_pairs(m, pairs);
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
  for (auto c : contexts)
    pairs += static_cast<double>(c) + 1; // attends to itself too
  const double flops = linear_flops_per_layer(m, contexts.size())
                       + attention_flops_for_pairs(m, pairs);
  r.compute_s = flops / flop_rate(g);
  // KV read per layer: every present token's row plus the new one.
  const double bytes =
      m.active_params / m.layers * m.weight_bytes_per_param
      + pairs * static_cast<double>(m.kv_bytes_per_token_layer);
  r.memory_s = bytes / byte_rate(g);
  r.layer_s = std::max(r.compute_s, r.memory_s);
  r.tpot_s = m.layers * r.layer_s + g.step_overhead_s;
  return r;
}

std::chrono::nanoseconds to_duration(double seconds) {
  return std::chrono::nanoseconds{
      static_cast<int64_t>(std::llround(seconds * 1e9))};
}

} // namespace dualpath::gpu
