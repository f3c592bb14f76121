// Small timing helpers shared by the engine actors: emulated "now" from an
// actor's clock, conversions between emulated time points and nanoseconds
// since the emulation start, nominal byte counts of real ones, and the
// compute model (gpu/compute_model.hpp) evaluated for an engine's config.
//
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "actors/engines/emulation.hpp"
#include "actors/engines/engine_context.hpp"
#include "gpu/compute_model.hpp"

#include <caf/result.hpp>
#include <caf/typed_response_promise.hpp>

namespace dualpath::actors {

/// The emulated time now, read from the actor's clock.
template <class Self>
emulated_time::time_point emulated_now(Self* self, const emulated_time& t) {
  return t.to_emulated(self->clock().now());
}

inline int64_t to_ns(emulated_time::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

/// Emulated ns since the start -> emulated time point.
inline emulated_time::time_point from_ns(const emulated_time& t, int64_t ns) {
  return t.start()
         + std::chrono::duration_cast<emulated_time::duration>(
             std::chrono::nanoseconds(ns));
}

/// Emulated ns since the start of an emulated time point.
inline int64_t since_start(const emulated_time& t,
                           emulated_time::time_point tp) {
  return to_ns(tp - t.start());
}

/// The nominal bytes `real` real bytes of KV stand for (whole tokens).
uint64_t nominal_of_real(uint64_t real, const model_shape& m);

/// The compute model's view of the engine's model and GPU.
gpu::model_shape compute_shape(const engine_config& cfg);
gpu::gpu_rate compute_rate(const engine_config& cfg);

/// Seconds one prefill layer of `batch` takes (0 without a GPU rate).
double prefill_layer_seconds(const engine_config& cfg,
                             const std::vector<gpu::sequence_shape>& batch);

/// Seconds per output token of one sequence with `context` tokens present.
double decode_tpot_seconds(const engine_config& cfg, uint64_t context);

/// Nominal HBM bytes an engine has free for KV (its device's real bytes in
/// use, scaled back up by the byte scale).
uint64_t free_hbm_nominal(const engine_config& cfg);

/// An engine's load report: `own()` (seq_e, tok_e, free HBM) completed with
/// its node's storage read queue, asked from the node's reader (the engine's
/// own numbers alone when there is no reader or it fails to answer).
template <class Self, class Own>
caf::result<engine_load> load_with_read_queue(Self* self, Own own) {
  auto& reader = self->state.cfg.node->reader;
  if (!reader)
    return own();
  auto rp = self->template make_response_promise<engine_load>();
  self->request(reader, caf::infinite, queue_atom_v)
      .then(
          [rp, own](read_queue_status& q) mutable {
            auto x = own();
            x.read_q_tokens = q.tokens;
            x.read_q_bytes = q.bytes;
            rp.deliver(std::move(x));
          },
          [rp, own](caf::error&) mutable { rp.deliver(own()); });
  return rp;
}

} // namespace dualpath::actors
