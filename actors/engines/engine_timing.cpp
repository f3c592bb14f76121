#include "actors/engines/engine_timing.hpp"

#include <algorithm>
#include <cmath>

#include <caf/scheduler/test_coordinator.hpp>

namespace dualpath::actors {

void run_next(caf::actor_system& sys, const caf::actor& to) {
  if (auto* c =
          dynamic_cast<caf::scheduler::test_coordinator*>(&sys.scheduler()))
    c->prioritize(to);
}

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

gpu::group_layer prefill_step_layer(
    const engine_config& cfg,
    const std::vector<std::vector<gpu::sequence_shape>>& per_gpu) {
  auto out = gpu::prefill_step_layer_time(compute_shape(cfg), cfg.gpu,
                                          cfg.group_model, per_gpu);
  // One engine layer = layer_weight model layers.
  auto w = layer_weight(cfg);
  for (auto& t : out.gpu_s)
    t *= w;
  out.slowest_s *= w;
  out.layer_s *= w;
  return out;
}

gpu::group_decode_step
decode_step(const engine_config& cfg,
            const std::vector<std::vector<uint64_t>>& contexts) {
  // Over the model's own layers: a coarsened engine decodes the same model.
  return gpu::decode_group_step_time(compute_shape(cfg), cfg.gpu,
                                     cfg.group_model, contexts);
}

double attention_seconds(const engine_config& cfg,
                         const gpu::sequence_shape& s) {
  return gpu::attention_seconds(compute_shape(cfg), cfg.gpu, s);
}

} // namespace dualpath::actors
