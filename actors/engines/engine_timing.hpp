// Small timing helpers shared by the engine actors: emulated "now" from an
// actor's clock, conversions between emulated time points and nanoseconds
// since the emulation start, nominal byte counts of real ones, and the
// compute model (gpu/compute_model.hpp) evaluated for an engine's config:
// a prefill step's layer and a decode step of the node's GPUs together.
//
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>

#include "actors/engines/emulation.hpp"
#include "actors/engines/engine_context.hpp"
#include "gpu/compute_model.hpp"

namespace dualpath::actors {

/// The emulated time now, read from the actor's clock.
template <class Self>
emulated_time::time_point emulated_now(Self* self, const emulated_time& t) {
  return t.to_emulated(self->clock().now());
}

inline int64_t to_ns(emulated_time::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

/// Sends `xs...` to the actor itself at emulated time `at`: at once (a plain
/// message, no timer) when `at` is not in the future, else delayed. Messages
/// due now stay in the order they were sent, so what happens at one instant
/// is handled together (a timer each would fire one by one).
template <class Self, class... Ts>
void send_at(Self* self, const emulated_time& t, emulated_time::time_point at,
             Ts&&... xs) {
  auto now = emulated_now(self, t);
  if (at <= now)
    self->send(self, std::forward<Ts>(xs)...);
  else
    self->delayed_send(self, t.to_actor(at - now), std::forward<Ts>(xs)...);
}

/// Under simulated time (the deterministic test coordinator), `to` runs
/// next, ahead of the jobs already queued; else nothing. A sender that hands
/// work to another actor calls it after the send, so the work happens in the
/// order one actor doing it inline would give: a simulation's results do
/// not depend on how its work is split between actors (a prefill engine and
/// its layer streamer).
void run_next(caf::actor_system& sys, const caf::actor& to);

/// Sends `xs...` to `to` and lets it run next (run_next).
template <class Self, class Handle, class... Ts>
void hand_off(Self* self, const Handle& to, Ts&&... xs) {
  self->send(to, std::forward<Ts>(xs)...);
  run_next(self->home_system(), caf::actor_cast<caf::actor>(to));
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

/// The compute model's view of the engine's model (its own layers: a
/// coarsened engine layer stands for several).
gpu::model_shape compute_shape(const engine_config& cfg);

/// One engine layer of a prefill step of the node's GPUs (`per_gpu[g]`: GPU
/// g's batch): each GPU's time and the layer's, the slowest GPU's plus the
/// overhead (gpu/compute_model.hpp), times the model layers an engine layer
/// stands for.
gpu::group_layer prefill_step_layer(
    const engine_config& cfg,
    const std::vector<std::vector<gpu::sequence_shape>>& per_gpu);

/// One decode step of the node's GPUs (`contexts[g]`: the present context of
/// every sequence on GPU g).
gpu::group_decode_step
decode_step(const engine_config& cfg,
            const std::vector<std::vector<uint64_t>>& contexts);

/// Predicted attention seconds of one request (cached, new) over every
/// layer: what the compute quota packs against.
double attention_seconds(const engine_config& cfg,
                         const gpu::sequence_shape& s);

} // namespace dualpath::actors
