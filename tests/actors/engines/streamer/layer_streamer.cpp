// ctest-label: engines
// ctest-links: actors_engines_prefill
// A prefill engine and its layer streamer under CAF's test coordinator
// (simulated time, exact), in Oracle mode (no reader, no bulk transport)
// with a stand-in decode node: the streamer, not the engine, runs the step
// (one `layer` message per layer, a layer time apart); if the streamer goes
// down the engine stops with an error naming it, and the streamer stops
// with its engine. In DualPath mode (modeled data plane), the next step's
// first layer loads while the running step's last layers compute, when its
// staging slot fits the GPU's HBM for KV next to both steps' windows.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <tuple>
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
  // Pushes asked for: layer, first token pushed, test clock since the start.
  std::vector<std::tuple<uint32_t, uint32_t, int64_t>> pushes;
};

// How long the stand-in decode node's push of a layer takes (emulated).
constexpr int64_t push_ns = 1'500'000;

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
              [l, t0, clock](push_atom, layer_batch& b) {
                auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               clock->now() - t0)
                               .count();
                for (auto& x : b.chunks)
                  l->pushes.emplace_back(b.layer, x.first_token, now);
                b.done_ns = now + push_ns;
                return b;
              },
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
  engine_config engine(load_mode mode = load_mode::oracle) {
    engine_config c;
    c.role = engine_role::prefill;
    c.gpus = 1;
    c.mode = mode;
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

  // Spawns a prefill engine, watched, and places one request on it (16
  // tokens unless `tokens` says otherwise).
  caf::actor start(engine_config cfg, uint32_t tokens = 16) {
    auto pe = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, cfg));
    caf::anon_send(watcher, pe);
    assignment a;
    a.request.id = 1;
    std::vector<uint32_t> ids;
    for (uint32_t t = 1; t <= tokens; ++t)
      ids.push_back(t);
    a.request.tokens = token_list(std::move(ids));
    a.request.gen_tokens = 1;
    a.prefill = engine_id{"pe", engine_role::prefill, 0};
    a.decode = engine_id{"de", engine_role::decode, 0};
    a.prefill_actor = pe;
    a.decode_actor = de;
    caf::anon_send(caf::actor_cast<prefill_engine_actor>(pe), prefill_atom_v,
                   work_batch{{a}});
    return pe;
  }

  caf::actor start() {
    return start(engine());
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

// A 100-token request in batches of 64 new tokens: step 1 computes tokens
// [0, 64), step 2 (packed while step 1's last layers compute) tokens
// [64, 100), its layer l loading tokens [0, 64) of layer l as a push from
// the decode node (push_ns). Window 2 over 5 layers; a layer slot of step 1
// is 64 x 64 B, of step 2 100 x 64 B.
namespace {

struct two_steps {
  int64_t step1_last_ns = -1;  // step 1's layer 4 at the decode node
  int64_t step2_first_ns = -1; // step 2's layer 0 at the decode node
  int64_t push0_ns = -1;       // step 2's layer 0 push asked for
};

two_steps run_two_steps(fixture& f, uint64_t hbm_kv_bytes) {
  auto cfg = f.engine(load_mode::dualpath);
  cfg.layer_window = 2;
  cfg.hbm_kv_bytes = hbm_kv_bytes;
  auto pe = f.start(cfg, 100);
  f.run_until_layers(10);
  two_steps r;
  REQUIRE_EQ(f.log->layers.size(), 10u);
  // Step 1's five layers, then step 2's: a layer message per layer.
  CHECK_EQ(f.log->layers, std::vector<uint32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4});
  r.step1_last_ns = f.log->at_ns[4];
  r.step2_first_ns = f.log->at_ns[5];
  for (auto& [layer, first, at] : f.log->pushes)
    if (layer == 0 && first == 0)
      r.push0_ns = at;
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  f.sched.run();
  return r;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "the next step's first layer loads while the "
                           "running step's last layers compute") {
  // Room for step 2's window (2 x 6,400 B) and its layer ahead (6,400 B).
  auto r = run_two_steps(*this, 3 * 6'400);
  REQUIRE(r.push0_ns >= 0);
  // Asked for before step 1's last layer is computed and sent ...
  CHECK(r.push0_ns < r.step1_last_ns);
  // ... so step 2's layer 0 computes right after step 1's layer 4 (one layer
  // time, as between step 1's layers), not a push later.
  auto layer_ns = log->at_ns[1] - log->at_ns[0];
  CHECK_EQ(r.step2_first_ns - r.step1_last_ns, layer_ns);
}

TEST_CASE_FIXTURE(fixture, "the layer ahead waits when its slot does not fit "
                           "the GPU's HBM for KV next to the windows") {
  // Step 2's window fits (2 x 6,400 B), its layer ahead next to it does not.
  auto r = run_two_steps(*this, 3 * 6'400 - 1);
  REQUIRE(r.push0_ns >= 0);
  // Step 2 loads once step 1 is sent: its layer 0 waits a push.
  CHECK(r.push0_ns >= r.step1_last_ns);
  CHECK(r.step2_first_ns - r.step1_last_ns >= push_ns);
}
