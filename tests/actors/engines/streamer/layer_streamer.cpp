// ctest-label: engines
// ctest-links: actors_engines_prefill
// A prefill engine and its layer streamer under CAF's test coordinator
// (simulated time, exact), in Oracle mode (no reader, no bulk transport)
// with a stand-in decode node: the streamer, not the engine, runs the step
// (one `layer` message per layer, a layer time apart); if the streamer goes
// down the engine stops with an error naming it, and the streamer stops
// with its engine.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/prefill/prefill_engine.hpp"
#include "actors/protocol/register.hpp"
#include "gpu/device.hpp"
#include "tests/actors/engines/engine_fixture.hpp"
#include "tests/support/support.hpp"

using namespace dualpath;
using namespace dualpath::actors;

namespace {

struct decode_log {
  std::vector<uint32_t> layers;
  std::vector<int64_t> at_ns; // test clock, since the start
  caf::actor sender;          // who sent the layer messages
};

struct down_log {
  std::vector<std::pair<caf::actor_addr, caf::error>> downs;
  const caf::error* reason_of(const caf::actor_addr& a) const {
    for (auto& [who, why] : downs)
      if (who == a)
        return &why;
    return nullptr;
  }
};

struct fixture : test::coordinator_fixture {
  std::shared_ptr<decode_log> log = std::make_shared<decode_log>();
  std::shared_ptr<down_log> downs = std::make_shared<down_log>();
  caf::actor de;
  caf::actor watcher;

  fixture() {
    auto l = log;
    auto t0 = sched.clock().now();
    auto* clock = &sched.clock();
    // Stands in for the decode node: admits at once, logs layers.
    de = sys.spawn(
        [l, t0, clock](caf::event_based_actor* self) -> caf::behavior {
          return {
              [](admit_atom, assignment& a) {
                return decode_slot{a.request.id, {}, {}};
              },
              [](prefilled_atom, prefill_summary&) {},
              [](release_atom, uint64_t) {},
              [self, l, t0, clock](layer_atom, layer_batch& b) {
                l->layers.push_back(b.layer);
                l->at_ns.push_back(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(
                        clock->now() - t0)
                        .count());
                l->sender = caf::actor_cast<caf::actor>(self->current_sender());
              },
          };
        });
    auto d = downs;
    watcher = sys.spawn([d](caf::event_based_actor* self) -> caf::behavior {
      self->set_down_handler([d](const caf::down_msg& dm) {
        d->downs.emplace_back(dm.source, dm.reason);
      });
      return {
          [self](caf::actor& x) { self->monitor(x); },
      };
    });
  }

  ~fixture() {
    caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
    sched.run();
  }

  // One GPU, 5 layers; a layer lasts its 1e-3 s of overhead (no FLOPs:
  // no model size); batches of up to 64 new tokens.
  engine_config engine() {
    engine_config c;
    c.role = engine_role::prefill;
    c.gpus = 1;
    c.mode = load_mode::oracle;
    c.packing = batching::token_budget;
    c.batch_tokens = 64;
    c.model.layers = 5;
    c.model.block_tokens = 4;
    c.model.nominal_bytes_per_token_layer = c.model.real_bytes_per_token_layer =
        64;
    c.time = time;
    c.node = std::make_shared<node_resources>();
    c.node->name = "pe";
    c.node->role = engine_role::prefill;
    test::add_host_gpus(c, 1, gpu::device_options{}.hbm_budget);
    c.gpu = gpu::gpu_rate{"toy", 10.0, 1.0, 1.0, 1.0, 0};
    c.group_model.layer_overhead_s = 1e-3;
    c.hbm_kv_bytes = 1 << 20;
    c.real_bytes = false;
    return c;
  }

  // Spawns a prefill engine, watched, and places one 16-token request on it.
  caf::actor start() {
    auto pe = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, engine()));
    caf::anon_send(watcher, pe);
    assignment a;
    a.request.id = 1;
    a.request.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    a.request.gen_tokens = 1;
    a.prefill = engine_id{"pe", engine_role::prefill, 0};
    a.decode = engine_id{"de", engine_role::decode, 0};
    a.prefill_actor = pe;
    a.decode_actor = de;
    caf::anon_send(caf::actor_cast<prefill_engine_actor>(pe), prefill_atom_v,
                   work_batch{{a}});
    return pe;
  }

  // Runs until the decode node has `n` layers (or nothing is left to run).
  void run_until_layers(size_t n) {
    test::run_until(sched, [&] { return log->layers.size() >= n; });
  }

  // A prefill engine one layer into its step, and its streamer (the sender
  // of the layer messages), both watched.
  std::pair<caf::actor, caf::actor> one_layer_in() {
    auto pe = start();
    run_until_layers(1);
    REQUIRE(log->sender);
    caf::anon_send(watcher, log->sender);
    sched.run();
    return {pe, log->sender};
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "the streamer runs the engine's step layer by "
                           "layer") {
  auto pe = start();
  run_until_layers(5);
  REQUIRE_EQ(log->layers, std::vector<uint32_t>{0, 1, 2, 3, 4});
  // From the streamer, not the engine.
  REQUIRE(log->sender);
  CHECK(log->sender != pe);
  // A layer time apart: its compute (the layer overhead dominates) ends
  // each layer.
  auto layer_ns = log->at_ns[0];
  CHECK(layer_ns >= 1'000'000);
  for (size_t l = 1; l < log->at_ns.size(); ++l)
    CHECK_EQ(log->at_ns[l] - log->at_ns[l - 1], layer_ns);
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "the engine stops naming its streamer when the "
                           "streamer goes down") {
  auto [pe, streamer] = one_layer_in();
  caf::anon_send_exit(streamer, caf::exit_reason::kill);
  sched.run();
  auto* why = downs->reason_of(pe.address());
  REQUIRE(why != nullptr);
  auto text = caf::to_string(*why);
  CAPTURE(text);
  CHECK(text.find("layer streamer went down") != std::string::npos);
  CHECK(text.find("kill") != std::string::npos);
  // The rest of the step never reaches the decode node.
  run_until_layers(5);
  CHECK_EQ(log->layers.size(), 1u);
}

TEST_CASE_FIXTURE(fixture, "the streamer stops with its engine") {
  auto [pe, streamer] = one_layer_in();
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  sched.run();
  auto* why = downs->reason_of(streamer.address());
  REQUIRE(why != nullptr);
  CHECK_EQ(*why, caf::make_error(caf::exit_reason::user_shutdown));
  run_until_layers(5);
  CHECK_EQ(log->layers.size(), 1u);
}
