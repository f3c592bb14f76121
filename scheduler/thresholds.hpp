// The two load thresholds of the paper's PE selection, as token counts, and
// how to derive them from hardware numbers (brief section 3):
//   alpha: tokens a node's storage NIC reads in alpha_s (default 3 s); a node
//          whose read queue is <= alpha is in the short-queue class;
//   beta:  tokens one GPU processes in beta_s (default 5 s); an engine whose
//          tok_e exceeds beta is overloaded and gets no new request.
// Pure functions of plain numbers; thread-safe.
#pragma once

#include <cstdint>

namespace dualpath::scheduler {

/// Thresholds used by PE selection (tokens).
struct thresholds {
  uint64_t alpha_tokens = 0;
  uint64_t beta_tokens = 0;
};

/// Default time windows of the paper.
constexpr double default_alpha_s = 3.0;
constexpr double default_beta_s = 5.0;

/// Storage NIC rate in tokens/s: bytes/s over KV bytes per token.
double read_tokens_per_s(double snic_bytes_per_s, double kv_bytes_per_token);

/// alpha = snic_bytes_per_s * alpha_s / kv_bytes_per_token (rounded down).
uint64_t derive_alpha(double snic_bytes_per_s, double kv_bytes_per_token,
                      double alpha_s = default_alpha_s);

/// Prompt tokens one GPU gets through per second, from a throughput argument:
/// only the miss fraction of a prompt is computed, each computed token costing
/// flops_per_token (about 2 x active parameters, plus attention), at
/// gpu_flops_per_s x mfu. tok_e counts whole prompts, so the rate is in those
/// units: gpu_flops_per_s * mfu / (flops_per_token * miss_fraction).
/// miss_fraction is clamped to [1e-6, 1].
double prefill_tokens_per_s(double gpu_flops_per_s, double mfu,
                            double flops_per_token, double miss_fraction);

/// beta = gpu_tokens_per_s * beta_s (rounded down).
uint64_t derive_beta(double gpu_tokens_per_s, double beta_s = default_beta_s);

} // namespace dualpath::scheduler
