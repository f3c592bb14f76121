#include "config/profiles.hpp"

namespace dualpath::config {

namespace {

using kv = std::pair<std::string, value>;

std::vector<profile> build_profiles() {
  std::vector<profile> out;
  // -- hardware
  // ----------------------------------------------------------------
  out.push_back(profile{
      "hardware",
      "paper-hopper",
      "The paper's testbed: nodes of 8 Hopper GPUs, one 400 Gb/s InfiniBand "
      "compute NIC per GPU, one 400 Gb/s storage NIC per node, ~500 GB/s DRAM "
      "per node, 80 GiB HBM per GPU, 80 GB DRAM buffer per node (DeepSeek "
      "models). gpu_efficiency 0.5 is an assumption (not in the paper).",
      {kv{"hardware.gpus_per_node", int64_t{8}},
       kv{"hardware.cnic_gbps", 400.0}, kv{"hardware.snic_gbps", 400.0},
       kv{"hardware.snic_per_node", int64_t{1}}, kv{"hardware.dram_gbs", 500.0},
       kv{"hardware.gpu_tflops", 989.0}, kv{"hardware.gpu_efficiency", 0.5},
       kv{"hardware.hbm_gib", 80.0}, kv{"hardware.hbm_tbps", 3.35},
       kv{"hardware.hbm_efficiency", 0.8}, kv{"hardware.dram_buffer_gib", 80.0},
       kv{"hardware.slice", int64_t{1}}}});
  out.push_back(profile{
      "hardware",
      "paper-hopper-slice8",
      "One GPU of each node of paper-hopper: 1 GPU per node with the "
      "paper's per-GPU compute, HBM and 400 Gb/s compute NIC; the node's "
      "storage NIC (50 Gb/s), DRAM bandwidth (62.5 GB/s) and DRAM buffer "
      "(10 GiB) are one GPU's share of the paper's node (1/8), and "
      "hardware.slice = 8 keeps each GPU's share of the weights. The "
      "storage-NIC-to-compute balance and the KV-to-compute ratio stay the "
      "paper's, so 1/8 of the agents load it as the paper's agents load "
      "its testbed (the default cluster of `dualpath run`).",
      {kv{"hardware.gpus_per_node", int64_t{1}},
       kv{"hardware.slice", int64_t{8}}, kv{"hardware.cnic_gbps", 400.0},
       kv{"hardware.snic_gbps", 50.0}, kv{"hardware.snic_per_node", int64_t{1}},
       kv{"hardware.dram_gbs", 62.5}, kv{"hardware.gpu_tflops", 989.0},
       kv{"hardware.gpu_efficiency", 0.5}, kv{"hardware.hbm_gib", 80.0},
       kv{"hardware.hbm_tbps", 3.35}, kv{"hardware.hbm_efficiency", 0.8},
       kv{"hardware.dram_buffer_gib", 10.0}}});
  // -- models
  // ------------------------------------------------------------------
  out.push_back(profile{
      "model",
      "ds-660b",
      "DeepSeek-V3.2 660B: 61 layers, MLA with FP8 KV (656 B per token per "
      "layer, ~40 KB per token), 37e9 activated parameters, 128 heads, "
      "absorbed MLA dims qk 576 / v 512, DeepSeek sparse attention (top-2048 "
      "keys per query, indexer 64 heads x 128); 671e9 parameters in all, "
      "0.6 of a token's linear FLOPs in its 8 routed experts (8 x 44M of "
      "~583M active parameters per MoE layer).",
      {kv{"model.name", std::string{"DeepSeek-V3.2 660B"}},
       kv{"model.layers", int64_t{61}},
       kv{"model.kv_bytes_per_token_layer", int64_t{656}},
       kv{"model.active_params", 37e9},
       kv{"model.attention", std::string{"dsa"}},
       kv{"model.attn_topk", int64_t{2048}},
       kv{"model.indexer_heads", int64_t{64}},
       kv{"model.indexer_dim", int64_t{128}},
       kv{"model.attn_heads", int64_t{128}},
       kv{"model.attn_qk_dim", int64_t{576}},
       kv{"model.attn_v_dim", int64_t{512}}, kv{"model.total_params", 671e9},
       kv{"model.routed_expert_share", 0.6},
       kv{"model.weight_bytes_per_param", 1.0}}});
  out.push_back(profile{
      "model",
      "ds-27b",
      "DS 27B: 30 layers with the same MLA dims as ds-660b (656 B per token "
      "per "
      "layer, ~19.7 KB per token). Assumptions (the paper gives neither): "
      "4.1e9 activated parameters and 16 heads, as in DeepSeek's 27B MoE "
      "(DeepSeek-VL2's language model, 30 layers), 27e9 parameters in all "
      "and ds-660b's routed share 0.6 (assumed alike).",
      {kv{"model.name", std::string{"DeepSeek 27B"}},
       kv{"model.layers", int64_t{30}},
       kv{"model.kv_bytes_per_token_layer", int64_t{656}},
       kv{"model.active_params", 4.1e9},
       kv{"model.attention", std::string{"mla"}},
       kv{"model.attn_heads", int64_t{16}},
       kv{"model.attn_qk_dim", int64_t{576}},
       kv{"model.attn_v_dim", int64_t{512}}, kv{"model.total_params", 27e9},
       kv{"model.routed_expert_share", 0.6},
       kv{"model.weight_bytes_per_param", 1.0}}});
  out.push_back(profile{
      "model",
      "qwen-32b",
      "Qwen2.5-32B: 64 layers, GQA with FP16 KV (8 KV heads x 128 dims x K,V x "
      "2 B = 4096 B per token per layer, 256 KiB per token), 32.5e9 "
      "parameters, 40 query heads of 128 dims; dense (no routed experts).",
      {kv{"model.name", std::string{"Qwen2.5-32B"}},
       kv{"model.layers", int64_t{64}},
       kv{"model.kv_bytes_per_token_layer", int64_t{4096}},
       kv{"model.active_params", 32.5e9},
       kv{"model.attention", std::string{"gqa"}},
       kv{"model.attn_heads", int64_t{40}},
       kv{"model.attn_qk_dim", int64_t{128}},
       kv{"model.attn_v_dim", int64_t{128}}, kv{"model.total_params", 32.5e9},
       kv{"model.routed_expert_share", 0.0},
       kv{"model.weight_bytes_per_param", 2.0}}});
  // -- workloads (Table 2 means)
  // -----------------------------------------------
  auto trace = [&](std::string name, int64_t turns, int64_t append, int64_t gen,
                   int64_t context, int64_t max_len) {
    out.push_back(profile{
        "workload",
        name,
        "Agentic trace with MaxLen " + std::to_string(max_len)
            + " (Table 2 means: turns, append, generated and context tokens).",
        {kv{"workload.turns", turns}, kv{"workload.append_tokens", append},
         kv{"workload.gen_tokens", gen}, kv{"workload.context_tokens", context},
         kv{"workload.max_len", max_len}}});
  };
  trace("trace-32k", 60, 608, 148, 17183, 32768);
  trace("trace-48k", 106, 474, 172, 25120, 49152);
  trace("trace-64k", 157, 429, 176, 32721, 65536);
  return out;
}

} // namespace

const std::vector<profile>& profiles() {
  static const std::vector<profile> table = build_profiles();
  return table;
}

const profile* find_profile(const std::string& section,
                            const std::string& name) {
  for (auto& p : profiles())
    if (p.section == section && p.name == name)
      return &p;
  return nullptr;
}

std::vector<std::string> profile_names(const std::string& section) {
  std::vector<std::string> out;
  for (auto& p : profiles())
    if (p.section == section)
      out.push_back(p.name);
  return out;
}

} // namespace dualpath::config
