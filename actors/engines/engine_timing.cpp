#include "actors/engines/engine_timing.hpp"

#include <algorithm>
#include <cmath>

#include "gpu/device.hpp"

namespace dualpath::actors {

uint64_t nominal_of_real(uint64_t real, const model_shape& m) {
  if (m.real_bytes_per_token_layer == 0)
    return real;
  return real / m.real_bytes_per_token_layer * m.nominal_bytes_per_token_layer;
}

namespace {

// Model layers one engine layer stands for (coarsen()).
double layer_weight(const engine_config& cfg) {
  return cfg.model.layer_weight > 0 ? cfg.model.layer_weight : 1.0;
}

} // namespace

gpu::model_shape compute_shape(const engine_config& cfg) {
  gpu::model_shape m;
  m.name = "engine";
  // The model's own layers (a coarsened engine layer stands for several).
  auto w = layer_weight(cfg);
  m.layers = static_cast<uint32_t>(std::lround(cfg.model.layers * w));
  m.active_params = cfg.model.active_params;
  m.attention_heads = cfg.model.attn_heads;
  m.qk_head_dim = cfg.model.attn_qk_dim;
  m.v_head_dim = cfg.model.attn_v_dim;
  m.sparse_topk = cfg.model.attn_topk;
  m.indexer_heads = cfg.model.indexer_heads;
  m.indexer_dim = cfg.model.indexer_dim;
  m.kv_bytes_per_token_layer = static_cast<uint64_t>(std::llround(
      static_cast<double>(cfg.model.nominal_bytes_per_token_layer) / w));
  return m;
}

gpu::gpu_rate compute_rate(const engine_config& cfg) {
  gpu::gpu_rate g;
  g.name = "engine";
  g.tflops = cfg.gpu_flops / 1e12;
  g.hbm_tbps = cfg.hbm_bandwidth / 1e12;
  return g;
}

double prefill_layer_seconds(const engine_config& cfg,
                             const std::vector<gpu::sequence_shape>& batch) {
  if (cfg.gpu_flops <= 0 || cfg.model.layers == 0)
    return 0;
  // One engine layer = layer_weight model layers.
  return gpu::prefill_layer_seconds(compute_shape(cfg), compute_rate(cfg),
                                    batch)
         * layer_weight(cfg);
}

double decode_tpot_seconds(const engine_config& cfg, uint64_t context) {
  if (cfg.gpu_flops <= 0 || cfg.model.layers == 0)
    return 0;
  auto m = compute_shape(cfg);
  auto g = compute_rate(cfg);
  if (cfg.hbm_bandwidth > 0)
    return gpu::decode_step_time(m, g, {context}).tpot_s;
  // Compute-bound: one new token attending to the context, every layer.
  return m.layers
         * gpu::prefill_layer_seconds(m, g, {gpu::sequence_shape{context, 1}});
}

uint64_t free_hbm_nominal(const engine_config& cfg) {
  uint64_t used = cfg.device ? cfg.device->bytes_allocated() : 0;
  uint64_t used_nominal = used * std::max<uint32_t>(cfg.byte_scale, 1);
  return cfg.hbm_bytes > used_nominal ? cfg.hbm_bytes - used_nominal : 0;
}

} // namespace dualpath::actors
