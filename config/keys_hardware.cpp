// [hardware]: the machines, per node and per GPU. Defaults = paper-hopper.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_hardware(std::vector<key_spec>& out) {
  out.push_back(profile_key("hardware", "paper-hopper"));
  out.push_back(int_key("hardware.gpus_per_node", 8, "GPUs",
                        "GPUs per node (g); each has its own compute NIC.",
                        range::at_least(1)));
  out.push_back(int_key(
      "hardware.slice", 1, "",
      "The emulated cluster is one slice of a cluster with this many times "
      "the GPUs per node (1: no slice): an expert-parallel replica spreads "
      "its weights over up to slice x the emulated GPUs of its role "
      "(engines.prefill_ep, decode_ep), so each GPU holds the share of the "
      "weights it holds in the whole cluster. A slice profile also divides "
      "the node's storage NIC, DRAM bandwidth and DRAM buffer by it.",
      range::at_least(1)));
  out.push_back(real_key("hardware.cnic_gbps", 400, "Gb/s",
                         "Compute-NIC bandwidth per GPU (B), per direction.",
                         range::above(0)));
  out.push_back(real_key("hardware.snic_gbps", 400, "Gb/s",
                         "Bandwidth of one storage NIC; a node's storage "
                         "bandwidth is snic_gbps x snic_per_node (s x B).",
                         range::above(0)));
  out.push_back(int_key("hardware.snic_per_node", 1, "NICs",
                        "Storage NICs per node.", range::at_least(1)));
  out.push_back(real_key("hardware.dram_gbs", 500, "GB/s",
                         "DRAM bandwidth per node (M), half duplex: reads and "
                         "writes share it.",
                         range::above(0)));
  out.push_back(real_key("hardware.gpu_tflops", 989, "TFLOP/s",
                         "Peak dense BF16 throughput per GPU (Hopper: 989).",
                         range::above(0)));
  out.push_back(real_key("hardware.gpu_efficiency", 0.5, "",
                         "Achieved fraction of gpu_tflops in prefill "
                         "(assumption; the paper does not state it).",
                         range::above_at_most(0, 1)));
  out.push_back(string_key(
      "hardware.prefill_efficiency_curve", "300:0.345,1500:0.862,3000:1",
      "How a GPU's prefill efficiency grows with the new tokens of its "
      "batch: comma-separated tokens:relative pairs (relative x "
      "gpu_efficiency is achieved; linear between points, flat after the "
      "last, constant time below the first). Default: the paper's Fig. 3 "
      "(right), batch 1 / 5 / 10 of 300 appended tokens at 1 / 2.5 / 2.9 "
      "x, flat from there."));
  out.push_back(real_key("hardware.layer_overhead_us", 30, "us",
                         "Added to every layer of a prefill or decode step "
                         "of an expert-parallel group (the experts' "
                         "all-to-all synchronization; assumption, the paper "
                         "does not state it).",
                         range::at_least(0)));
  out.push_back(
      real_key("hardware.hbm_gib", 80, "GiB", "HBM per GPU.", range::above(0)));
  out.push_back(real_key("hardware.hbm_tbps", 3.35, "TB/s",
                         "HBM bandwidth per GPU (H100/H800 SXM: 3.35; H200: "
                         "4.8); bounds decode steps.",
                         range::above(0)));
  out.push_back(real_key("hardware.hbm_efficiency", 0.8, "",
                         "Achieved fraction of hbm_tbps in decode "
                         "(assumption; the paper does not state it).",
                         range::above_at_most(0, 1)));
  out.push_back(real_key("hardware.dram_buffer_gib", 80, "GiB",
                         "DRAM buffer for KV per node (paper: 80 GB for "
                         "DeepSeek models, 320 GB for Qwen).",
                         range::above(0)));
}

} // namespace dualpath::config::keys
