// [model]: the served model's shape. Defaults = ds-660b.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_model(std::vector<key_spec>& out) {
  out.push_back(profile_key("model", "ds-660b"));
  out.push_back(string_key("model.name", "DeepSeek-V3.2 660B",
                           "Human-readable model name (reports only)."));
  out.push_back(int_key("model.layers", 61, "layers",
                        "Transformer layers; a Full Block holds one Layer "
                        "Block per layer.",
                        range::at_least(1)));
  out.push_back(int_key("model.kv_bytes_per_token_layer", 656, "bytes",
                        "KV-cache bytes of one token in one layer.",
                        range::at_least(1)));
  out.push_back(real_key("model.active_params", 37e9, "parameters",
                         "Parameters active per token (compute model: "
                         "2 FLOP per active parameter per token).",
                         range::above(0)));
  out.push_back(choice_key("model.attention", "dsa", {"dsa", "mla", "gqa"},
                           "Attention kind: DeepSeek sparse attention over "
                           "MLA (dsa: an indexer scores every key, each "
                           "query attends to attn_topk keys), dense "
                           "multi-head latent (mla) or grouped-query (gqa)."));
  out.push_back(int_key("model.attn_topk", 2048, "tokens",
                        "dsa: keys each query attends to at most.",
                        range::at_least(1)));
  out.push_back(int_key("model.indexer_heads", 64, "heads",
                        "dsa: heads of the lightning indexer.",
                        range::at_least(1)));
  out.push_back(int_key("model.indexer_dim", 128, "",
                        "dsa: dimension per indexer head.",
                        range::at_least(1)));
  out.push_back(int_key("model.attn_heads", 128, "heads",
                        "Query heads (attention FLOPs).", range::at_least(1)));
  out.push_back(int_key("model.attn_qk_dim", 576, "",
                        "Query/key dimension per head as computed (MLA: "
                        "absorbed latent + rope dims).",
                        range::at_least(1)));
  out.push_back(int_key("model.attn_v_dim", 512, "",
                        "Value dimension per head as computed.",
                        range::at_least(1)));
  out.push_back(real_key("model.total_params", 671e9, "parameters",
                         "Parameters stored (every expert): the weights a "
                         "replica spreads over engines.prefill_ep / "
                         "decode_ep GPUs, which HBM holds besides the KV.",
                         range::above(0)));
  out.push_back(real_key("model.routed_expert_share", 0.6, "",
                         "Share of the linear FLOPs of a token in routed "
                         "experts, which an expert-parallel group spreads "
                         "over its GPUs (0: a dense model).",
                         range::between(0, 1)));
  out.push_back(real_key("model.weight_bytes_per_param", 1, "bytes",
                         "Bytes per weight as stored (FP8: 1, BF16: 2); "
                         "decode steps read the active weights from HBM.",
                         range::above(0)));
}

} // namespace dualpath::config::keys
