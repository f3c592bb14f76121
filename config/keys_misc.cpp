// [gpu], [engines], [scheduler], [run], [sim], [caf]: small sections, one
// function each (move a section to its own file when it grows).
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_gpu(std::vector<key_spec>& out) {
  section_keys s{out, "gpu"};
  s.choice("backend", "auto", {"auto", "cuda", "host"},
           "Where the engines' KV lives (`dualpath run`, `dualpath node`): "
           "cuda = every engine rank on a CUDA device, KV layers in device "
           "memory, the decode engine verifying KV there with the checksum "
           "kernel (without a usable device: exit 2); host = host memory "
           "standing in for HBM; auto = cuda when a device can be used, else "
           "host, said once. `dualpath sim` only counts HBM.");
  s.integer("device", 0, "", range::at_least(0),
            "CUDA device of engine rank 0: rank r uses device (gpu.device + r) "
            "mod the devices present, unless the cluster file lists the node's "
            "gpus (rank r -> gpus[r]). Must be a device the machine has.");
  s.boolean("h2d_via_transport", false,
            "Route host-to-device copies through the bulk transport "
            "(CNIC-centric, brief 2.3) instead of a local copy.");
}

void add_engines(std::vector<key_spec>& out) {
  section_keys s{out, "engines"};
  s.integer("layer_window", 2, "layers", range::at_least(1),
            "Layers whose KV may be in flight or resident on the GPU at once "
            "(prefetch depth).");
  s.integer(
      "prefill_ep", 16, "GPUs", range::at_least(1),
      "GPUs one prefill replica's weights are spread over (expert parallel; at "
      "most the prefill GPUs): each holds total_params / prefill_ep of them.");
  s.integer("decode_ep", 32, "GPUs", range::at_least(1),
            "GPUs one decode replica's weights are spread over (at most the "
            "decode GPUs).");
  s.real("activation_reserve_gib", 8, "GiB", range::at_least(0),
         "HBM per GPU kept for activations: the KV budget is hbm_gib - weights "
         "per GPU - this.");
  s.integer("basic_batch_tokens", 16384, "tokens", range::at_least(1),
            "New tokens per GPU per prefill step in the modes without the "
            "scheduler's compute quota (basic, layerwise, dualpath-rr), packed "
            "FIFO; a longer request is chunked.");
}

void add_scheduler(std::vector<key_spec>& out) {
  section_keys s{out, "scheduler"};
  s.real("alpha_s", 3.0, "s", range::above(0),
         "alpha: a read queue is short if readable within this time.");
  s.real("beta_s", 5.0, "s", range::above(0),
         "beta: an engine is overloaded if its tokens need more than this time "
         "to process.");
  s.integer("quota_ms", 300, "ms", range::at_least(1),
            "Compute quota of one GPU's prefill batch in the scheduler's modes "
            "(dualpath, oracle): requests are packed FIFO while their "
            "predicted attention time fits, the one overflowing is chunked.");
  s.integer("fetch_period_ms", 10, "ms", range::at_least(1),
            "How often engine groups fetch work.");
  s.boolean(
      "split_reads", true,
      "Split one request's reads across both paths (the paper's future work).");
  s.real("de_headroom", 1.05, "", range::at_least(1),
         "Z factor of decode-engine selection.");
}

void add_run(std::vector<key_spec>& out) {
  section_keys s{out, "run"};
  s.integer("prefill_nodes", 2, "nodes", range::at_least(1),
            "Prefill nodes (P).");
  s.integer("decode_nodes", 4, "nodes", range::at_least(1),
            "Decode nodes (D).");
  s.real("time_scale", 1.0, "", range::above(0),
         "Emulated seconds per wall-clock second: the emulated cluster runs "
         "this many times faster than real time (all link and compute times "
         "shrink by it; reported times are emulated).");
  s.integer("byte_scale", 0, "", range::at_least(0),
            "Nominal KV bytes per real byte moved: real copies carry "
            "ceil(kv_bytes_per_token_layer / byte_scale) bytes per token and "
            "layer, timing uses the nominal sizes. 0 = "
            "kv_bytes_per_token_layer (one real byte per token and layer).");
  s.integer(
      "turns", 2, "turns", range::at_least(0),
      "Turns replayed per trajectory, from the middle of each trajectory "
      "(earlier turns are history already in storage). 0 = whole trajectories: "
      "every turn from the first, the store starts empty (only a trace file's "
      "own `history` turns are in storage; docs/workload.md).");
  s.string("modes", "all",
           "Modes run one after another: all (basic, dualpath, oracle), "
           "ablation (basic, layerwise, dualpath-rr, dualpath, oracle) or a "
           "comma list of basic, layerwise, dualpath-rr (dual path with "
           "round-robin placement), dualpath, oracle.");
  s.real("aps", 0, "agents/s", range::at_least(0),
         "Online arrivals: agents per emulated second (Poisson); 0 = offline, "
         "every agent at once.");
  s.integer("wall_limit_s", 600, "s", range::at_least(1),
            "Wall-clock limit of one mode's replay.");
  s.integer("role_loss_grace_s", 5, "s", range::at_least(0),
            "`dualpath run --cluster` only: how long every node of an engine "
            "role (prefill or decode) may be missing from the deployment's "
            "cluster view before the job fails, naming the role (a node "
            "restarted under its name joins again within it). A scheduler "
            "node that stops answering fails the job at once.");
}

void add_sim(std::vector<key_spec>& out) {
  section_keys s{out, "sim"};
  s.integer(
      "layers_per_step", 1, "layers", range::at_least(1),
      "`dualpath sim` only: model layers the engines take as one step (loaded, "
      "computed and sent together; ceil(layers / k) steps of equal size, the "
      "same KV bytes and FLOPs in all). Fewer messages per request, coarser "
      "layerwise overlap; docs/simulation.md measures the error. 1 = every "
      "layer (as `dualpath run`, which accepts nothing else).");
}

void add_caf(std::vector<key_spec>& out) {
  section_keys s{out, "caf"};
  s.choice(
      "scheduler_policy", "sharing", {"sharing", "stealing", "testing"},
      "CAF scheduler policy (sharing had the lowest remote latency here).");
  s.boolean("profiling", false, "CAF per-worker/per-actor CPU profiling.");
  s.string("profiling_file", "",
           "Where CAF writes the profile; empty: caf-profile.txt in the "
           "working directory.");
  s.integer("profiling_resolution_ms", 100, "ms", range::at_least(1),
            "How often CAF's profiler samples (CAF's "
            "scheduler.profiling-resolution).");
}

} // namespace dualpath::config::keys
