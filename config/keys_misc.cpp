// [gpu], [engines], [scheduler], [run], [sim], [caf]: small sections, one
// function each (move a section to its own file when it grows).
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_gpu(std::vector<key_spec>& out) {
  out.push_back(choice_key(
      "gpu.backend", "auto", {"auto", "cuda", "host"},
      "Where the engines' KV lives (`dualpath run`, `dualpath node`): cuda = "
      "every engine rank on a CUDA device, KV layers in device memory, the "
      "decode engine verifying KV there with the checksum kernel (without a "
      "usable device: exit 2); host = host memory standing in for HBM; auto "
      "= cuda when a device can be used, else host, said once. `dualpath "
      "sim` only counts HBM."));
  out.push_back(int_key("gpu.device", 0, "",
                        "CUDA device of engine rank 0: rank r uses device "
                        "(gpu.device + r) mod the devices present, unless "
                        "the cluster file lists the node's gpus (rank r -> "
                        "gpus[r]). Must be a device the machine has.",
                        range::at_least(0)));
  out.push_back(bool_key("gpu.h2d_via_transport", false,
                         "Route host-to-device copies through the bulk "
                         "transport (CNIC-centric, brief 2.3) instead of a "
                         "local copy."));
}

void add_engines(std::vector<key_spec>& out) {
  out.push_back(int_key("engines.layer_window", 2, "layers",
                        "Layers whose KV may be in flight or resident on the "
                        "GPU at once (prefetch depth).",
                        range::at_least(1)));
  out.push_back(int_key("engines.prefill_ep", 16, "GPUs",
                        "GPUs one prefill replica's weights are spread over "
                        "(expert parallel; at most the prefill GPUs): each "
                        "holds total_params / prefill_ep of them.",
                        range::at_least(1)));
  out.push_back(int_key("engines.decode_ep", 32, "GPUs",
                        "GPUs one decode replica's weights are spread over "
                        "(at most the decode GPUs).",
                        range::at_least(1)));
  out.push_back(real_key("engines.activation_reserve_gib", 8, "GiB",
                         "HBM per GPU kept for activations: the KV budget is "
                         "hbm_gib - weights per GPU - this.",
                         range::at_least(0)));
  out.push_back(int_key("engines.basic_batch_tokens", 16384, "tokens",
                        "New tokens per GPU per prefill step in the modes "
                        "without the scheduler's compute quota (basic, "
                        "layerwise, dualpath-rr), packed FIFO; a longer "
                        "request is chunked.",
                        range::at_least(1)));
}

void add_scheduler(std::vector<key_spec>& out) {
  out.push_back(real_key("scheduler.alpha_s", 3.0, "s",
                         "alpha: a read queue is short if readable within "
                         "this time.",
                         range::above(0)));
  out.push_back(real_key("scheduler.beta_s", 5.0, "s",
                         "beta: an engine is overloaded if its tokens need "
                         "more than this time to process.",
                         range::above(0)));
  out.push_back(int_key("scheduler.quota_ms", 300, "ms",
                        "Compute quota of one GPU's prefill batch in the "
                        "scheduler's modes (dualpath, oracle): requests are "
                        "packed FIFO while their predicted attention time "
                        "fits, the one overflowing is chunked.",
                        range::at_least(1)));
  out.push_back(int_key("scheduler.fetch_period_ms", 10, "ms",
                        "How often engine groups fetch work.",
                        range::at_least(1)));
  out.push_back(bool_key("scheduler.split_reads", true,
                         "Split one request's reads across both paths "
                         "(the paper's future work)."));
  out.push_back(real_key("scheduler.de_headroom", 1.05, "",
                         "Z factor of decode-engine selection.",
                         range::at_least(1)));
}

void add_run(std::vector<key_spec>& out) {
  out.push_back(int_key("run.prefill_nodes", 2, "nodes", "Prefill nodes (P).",
                        range::at_least(1)));
  out.push_back(int_key("run.decode_nodes", 4, "nodes", "Decode nodes (D).",
                        range::at_least(1)));
  out.push_back(real_key("run.time_scale", 1.0, "",
                         "Emulated seconds per wall-clock second: the "
                         "emulated cluster runs this many times faster than "
                         "real time (all link and compute times shrink by "
                         "it; reported times are emulated).",
                         range::above(0)));
  out.push_back(int_key("run.byte_scale", 0, "",
                        "Nominal KV bytes per real byte moved: real copies "
                        "carry ceil(kv_bytes_per_token_layer / byte_scale) "
                        "bytes per token and layer, timing uses the nominal "
                        "sizes. 0 = kv_bytes_per_token_layer (one real byte "
                        "per token and layer).",
                        range::at_least(0)));
  out.push_back(int_key("run.turns", 2, "turns",
                        "Turns replayed per trajectory, from the middle of "
                        "each trajectory (earlier turns are history already "
                        "in storage). 0 = whole trajectories: every turn "
                        "from the first, the store starts empty (only a "
                        "trace file's own `history` turns are in storage; "
                        "docs/workload.md).",
                        range::at_least(0)));
  out.push_back(string_key("run.modes", "all",
                           "Modes run one after another: all (basic, "
                           "dualpath, oracle), ablation (basic, layerwise, "
                           "dualpath-rr, dualpath, oracle) or a comma list "
                           "of basic, layerwise, dualpath-rr (dual path with "
                           "round-robin placement), dualpath, oracle."));
  out.push_back(real_key("run.aps", 0, "agents/s",
                         "Online arrivals: agents per emulated second "
                         "(Poisson); 0 = offline, every agent at once.",
                         range::at_least(0)));
  out.push_back(int_key("run.wall_limit_s", 600, "s",
                        "Wall-clock limit of one mode's replay.",
                        range::at_least(1)));
}

void add_sim(std::vector<key_spec>& out) {
  out.push_back(int_key(
      "sim.layers_per_step", 1, "layers",
      "`dualpath sim` only: model layers the engines take as one step "
      "(loaded, computed and sent together; ceil(layers / k) steps of equal "
      "size, the same KV bytes and FLOPs in all). Fewer messages per request, "
      "coarser layerwise overlap; docs/simulation.md measures the error. "
      "1 = every layer (as `dualpath run`, which accepts nothing else).",
      range::at_least(1)));
}

void add_caf(std::vector<key_spec>& out) {
  out.push_back(choice_key("caf.scheduler_policy", "sharing",
                           {"sharing", "stealing", "testing"},
                           "CAF scheduler policy (sharing had the lowest "
                           "remote latency here)."));
  out.push_back(bool_key("caf.profiling", false,
                         "CAF per-worker/per-actor CPU profiling."));
  out.push_back(string_key("caf.profiling_file", "",
                           "Where CAF writes the profile; empty: "
                           "caf-profile.txt in the working directory."));
  out.push_back(int_key("caf.profiling_resolution_ms", 100, "ms",
                        "How often CAF's profiler samples (CAF's "
                        "scheduler.profiling-resolution).",
                        range::at_least(1)));
}

} // namespace dualpath::config::keys
