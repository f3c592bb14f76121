#include "actors/cluster/bounds.hpp"

#include <algorithm>

#include "gpu/compute_model.hpp"

namespace dualpath::actors::cluster {

namespace workload = scheduler::workload;

namespace {

uint64_t full_blocks_tokens(uint64_t tokens, uint32_t block_tokens) {
  return block_tokens == 0 ? 0 : tokens / block_tokens * block_tokens;
}

} // namespace

uint64_t hit_tokens(const workload::trajectory& traj, size_t turn_index,
                    uint32_t block_tokens) {
  auto before =
      workload::prompt_length(traj, turn_index) - traj.turns[turn_index].append;
  return full_blocks_tokens(before, block_tokens);
}

fluid_bounds trace_bounds(const workload::trace& replayed,
                          const cluster_spec& spec) {
  fluid_bounds b;
  const auto& m = spec.model;
  for (auto& t : replayed) {
    // The context before each turn's append, walked once (prompt_length()
    // per turn would be quadratic in the trajectory's length).
    uint64_t before = 0;
    for (size_t i = 0; i < t.turns.size(); ++i) {
      auto& turn = t.turns[i];
      if (i >= t.history_turns) {
        auto hit = full_blocks_tokens(before, spec.block_tokens);
        auto prompt = before + turn.append;
        b.hit_tokens += hit;
        b.prefill_flops += gpu::prefill_flops_per_layer(
                               m, {gpu::sequence_shape{hit, prompt - hit}})
                           * m.layers;
      }
      before += uint64_t{turn.append} + turn.gen;
    }
  }
  b.hit_bytes = b.hit_tokens * kv_bytes_per_token(m);
  auto pe_gpus = static_cast<double>(spec.prefill_nodes) * spec.gpus_per_node;
  auto flop_rate =
      pe_gpus * spec.gpu.tflops * 1e12 * spec.gpu.compute_efficiency;
  auto snic = static_cast<double>(spec.snic_bytes_per_s);
  auto bytes = static_cast<double>(b.hit_bytes);
  b.pe_flops_per_s = flop_rate;
  b.pe_snic_bytes_per_s = spec.prefill_nodes * snic;
  b.all_snic_bytes_per_s = (spec.prefill_nodes + spec.decode_nodes) * snic;
  if (b.pe_flops_per_s > 0)
    b.prefill_compute_s = b.prefill_flops / b.pe_flops_per_s;
  if (b.pe_snic_bytes_per_s > 0)
    b.pe_snic_s = bytes / b.pe_snic_bytes_per_s;
  if (b.all_snic_bytes_per_s > 0)
    b.all_snic_s = bytes / b.all_snic_bytes_per_s;
  return b;
}

mode_bound bound_for(const fluid_bounds& b, load_mode mode) {
  mode_bound compute{"prefill_compute", b.prefill_compute_s};
  auto larger = [&](mode_bound io) { return io.s > compute.s ? io : compute; };
  switch (mode) {
    case load_mode::basic:
    case load_mode::layerwise:
      return larger({"pe_snic", b.pe_snic_s});
    case load_mode::dualpath:
      return larger({"all_snic", b.all_snic_s});
    case load_mode::oracle:
      break;
  }
  return compute;
}

} // namespace dualpath::actors::cluster
