// What the engine suites (decode, prefill, layer streamer) share: an actor
// system on CAF's test coordinator (simulated time: the test runs every job
// and fires every timer), the toy model whose step times those suites work by
// hand, its GPUs, and the token ids of its requests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <doctest/doctest.h>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/emulation.hpp"
#include "actors/engines/engine_context.hpp"
#include "gpu/device.hpp"
#include "tests/actors/actor_config.hpp"

namespace dualpath::test {

/// An actor system on the test coordinator; `time` starts at its clock's
/// start, one emulated second per second.
struct coordinator_fixture {
  actor_config cfg{"testing"};
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  actors::emulated_time time{sched.clock().now(), 1.0};
};

/// Adds `gpus` host devices without backing memory (timing only) of
/// `hbm_budget` bytes each to `c`.
inline void add_host_gpus(actors::engine_config& c, uint32_t gpus,
                          uint64_t hbm_budget) {
  for (uint32_t g = 0; g < gpus; ++g) {
    gpu::device_options d;
    d.backend = gpu::backend_choice::host;
    d.hbm_budget = hbm_budget;
    d.backed = false;
    auto dev = gpu::make_host_device(d);
    REQUIRE(dev);
    c.devices.push_back(*dev);
  }
}

/// An engine of `role` with `gpus` GPUs on node "pe" or "de", serving a toy
/// model whose numbers are easy to work by hand: 5 layers, 8e8 linear FLOPs
/// per token per layer (2 * 2e9 / 5), attention 2 * 16 * (128 + 128) = 8192
/// FLOPs per (query, key) pair, 64 B of KV per token per layer, blocks of 4
/// tokens; GPUs of 10 TFLOP/s and 1 TB/s, 1 MiB of HBM, holding 1e9 B of
/// weights, 1e-4 s of overhead per layer; timing only (no real bytes, no
/// verification); it fetches from `scheduler` every second.
inline actors::engine_config toy_engine(actors::engine_role role, uint32_t gpus,
                                        const actors::emulated_time& time,
                                        caf::actor scheduler) {
  actors::engine_config c;
  c.role = role;
  c.gpus = gpus;
  c.model.layers = 5;
  c.model.block_tokens = 4;
  c.model.nominal_bytes_per_token_layer = 64;
  c.model.real_bytes_per_token_layer = 64;
  c.model.active_params = 2e9;
  c.model.attn_heads = 16;
  c.model.attn_qk_dim = 128;
  c.model.attn_v_dim = 128;
  c.time = time;
  c.node = std::make_shared<actors::node_resources>();
  c.node->name = role == actors::engine_role::prefill ? "pe" : "de";
  c.node->role = role;
  add_host_gpus(c, gpus, 1 << 20);
  c.gpu = gpu::gpu_rate{"toy", 10.0, 1.0, 1.0, 1.0, 0};
  c.group_model.weight_bytes_per_gpu = 1e9;
  c.group_model.layer_overhead_s = 1e-4;
  c.real_bytes = false;
  c.verify_kv = false;
  c.scheduler = std::move(scheduler);
  c.fetch_period_ns = 1'000'000'000;
  return c;
}

/// The prompt of request `id`: `n` token ids 1000 * id, 1000 * id + 1, ...
inline std::vector<uint32_t> toy_tokens(uint64_t id, uint32_t n) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < n; ++i)
    ids.push_back(1000 * static_cast<uint32_t>(id) + i);
  return ids;
}

} // namespace dualpath::test
