// [model]: the served model's shape. Defaults = ds-660b.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_model(std::vector<key_spec>& out) {
  section_keys s{out, "model"};
  s.profile("ds-660b");
  s.string("name", "DeepSeek-V3.2 660B",
           "Human-readable model name (reports only).");
  s.integer(
      "layers", 61, "layers", range::at_least(1),
      "Transformer layers; a Full Block holds one Layer Block per layer.");
  s.integer("kv_bytes_per_token_layer", 656, "bytes", range::at_least(1),
            "KV-cache bytes of one token in one layer.");
  s.real("active_params", 37e9, "parameters", range::above(0),
         "Parameters active per token (compute model: 2 FLOP per active "
         "parameter per token).");
  s.choice("attention", "dsa", {"dsa", "mla", "gqa"},
           "Attention kind: DeepSeek sparse attention over MLA (dsa: an "
           "indexer scores every key, each query attends to attn_topk keys), "
           "dense multi-head latent (mla) or grouped-query (gqa).");
  s.integer("attn_topk", 2048, "tokens", range::at_least(1),
            "dsa: keys each query attends to at most.");
  s.integer("indexer_heads", 64, "heads", range::at_least(1),
            "dsa: heads of the lightning indexer.");
  s.integer("indexer_dim", 128, "", range::at_least(1),
            "dsa: dimension per indexer head.");
  s.integer("attn_heads", 128, "heads", range::at_least(1),
            "Query heads (attention FLOPs).");
  s.integer("attn_qk_dim", 576, "", range::at_least(1),
            "Query/key dimension per head as computed (MLA: absorbed latent + "
            "rope dims).");
  s.integer("attn_v_dim", 512, "", range::at_least(1),
            "Value dimension per head as computed.");
  s.real(
      "total_params", 671e9, "parameters", range::above(0),
      "Parameters stored (every expert): the weights a replica spreads over "
      "engines.prefill_ep / decode_ep GPUs, which HBM holds besides the KV.");
  s.real("routed_expert_share", 0.6, "", range::between(0, 1),
         "Share of the linear FLOPs of a token in routed experts, which an "
         "expert-parallel group spreads over its GPUs (0: a dense model).");
  s.real("weight_bytes_per_param", 1, "bytes", range::above(0),
         "Bytes per weight as stored (FP8: 1, BF16: 2); decode steps read the "
         "active weights from HBM.");
}

} // namespace dualpath::config::keys
