#include "scheduler/thresholds.hpp"

#include <algorithm>

namespace dualpath::scheduler {

double read_tokens_per_s(double snic_bytes_per_s, double kv_bytes_per_token) {
  return kv_bytes_per_token > 0 ? snic_bytes_per_s / kv_bytes_per_token : 0.0;
}

uint64_t derive_alpha(double snic_bytes_per_s, double kv_bytes_per_token,
                      double alpha_s) {
  auto t = read_tokens_per_s(snic_bytes_per_s, kv_bytes_per_token) * alpha_s;
  return t > 0 ? static_cast<uint64_t>(t) : 0;
}

double prefill_tokens_per_s(double gpu_flops_per_s, double mfu,
                            double flops_per_token, double miss_fraction) {
  miss_fraction = std::clamp(miss_fraction, 1e-6, 1.0);
  if (!(flops_per_token > 0))
    return 0.0;
  return gpu_flops_per_s * mfu / (flops_per_token * miss_fraction);
}

uint64_t derive_beta(double gpu_tokens_per_s, double beta_s) {
  auto t = gpu_tokens_per_s * beta_s;
  return t > 0 ? static_cast<uint64_t>(t) : 0;
}

} // namespace dualpath::scheduler
