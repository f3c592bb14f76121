// ctest-label: engines
// ctest-links: actors_engines_decode
// The prefill engine under CAF's test coordinator (simulated time, exact),
// in Oracle mode (no reader, no bulk transport: no I/O threads) with a real
// decode engine behind it: a step lasts as long as its slowest GPU (the node's
// GPUs step together), worked by hand; a request larger than the compute quota
// is chunked across steps; the engine fetches for its group and reports every
// GPU's load.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/decode/decode_engine.hpp"
#include "actors/engines/prefill/prefill_engine.hpp"
#include "actors/protocol/register.hpp"
#include "gpu/device.hpp"
#include "tests/actors/engines/engine_fixture.hpp"
#include "tests/support/support.hpp"

using namespace dualpath;
using namespace dualpath::actors;

namespace {

struct fake_scheduler_state {
  std::vector<group_report> fetches;
  std::vector<request_result> results;
  std::vector<assignment> to_hand_out;
};

struct fixture : test::coordinator_fixture {
  std::shared_ptr<fake_scheduler_state> fake =
      std::make_shared<fake_scheduler_state>();
  caf::actor scheduler;

  fixture() {
    auto f = fake;
    // Stands in for the global scheduler: hands out what the test queued,
    // collects results.
    scheduler = sys.spawn([f](caf::event_based_actor*) -> caf::behavior {
      return {
          [f](fetch_atom, group_report& g) {
            f->fetches.push_back(std::move(g));
            work_batch w;
            w.items = std::move(f->to_hand_out);
            f->to_hand_out.clear();
            return w;
          },
          [f](done_atom, request_result& r) { f->results.push_back(r); },
          [](report_atom, group_report&) {},
          [](fail_atom, request_failure&) { FAIL("a request failed"); },
      };
    });
  }

  // The toy model of engine_fixture.hpp in Oracle mode, packed by a 1 s
  // compute quota; routed experts half the linear FLOPs, spread over the
  // node's GPUs.
  engine_config engine(engine_role role, uint32_t gpus) {
    auto c = test::toy_engine(role, gpus, time, scheduler);
    c.mode = load_mode::oracle;
    c.packing = batching::quota;
    c.quota_s = 1.0;
    c.group_model.routed_share = 0.5;
    c.hbm_kv_bytes = 1 << 20;
    c.stats = std::make_shared<engine_stats>();
    return c;
  }

  static assignment make(uint64_t id, uint32_t tokens, uint32_t pe_rank,
                         caf::actor pe, caf::actor de, read_plan plan) {
    assignment a;
    a.request.id = id;
    a.request.tokens = test::toy_tokens(id, tokens);
    a.request.gen_tokens = 1; // done at the first token: done = TTFT
    a.prefill = engine_id{"pe", engine_role::prefill, pe_rank};
    a.decode = engine_id{"de", engine_role::decode, 0};
    a.plan = plan;
    a.prefill_actor = pe;
    a.decode_actor = de;
    return a;
  }

  // Places `xs` as the scheduler does: assign to the decode engine, the
  // batch to the prefill engine.
  void place(const caf::actor& pe, const caf::actor& de,
             std::vector<assignment> xs) {
    for (auto& a : xs)
      caf::anon_send(caf::actor_cast<decode_engine_actor>(de), assign_atom_v,
                     a);
    caf::anon_send(caf::actor_cast<prefill_engine_actor>(pe), prefill_atom_v,
                   work_batch{std::move(xs)});
  }

  void run_until_results(size_t n) {
    test::run_until(sched, [&] { return fake->results.size() >= n; });
  }

  const request_result& result(uint64_t id) {
    for (auto& r : fake->results)
      if (r.id == id)
        return r;
    FAIL("no result for request " << id);
    return fake->results.front();
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "a step lasts as long as its slowest GPU") {
  auto pe = caf::actor_cast<caf::actor>(
      spawn_prefill_engine(sys, engine(engine_role::prefill, 2)));
  auto de = caf::actor_cast<caf::actor>(
      spawn_decode_engine(sys, engine(engine_role::decode, 1)));
  sched.run();
  // Request 1 on GPU 0: 40 tokens, 8 cached (2 hit blocks), 32 new:
  // 32 * 8 + 32 * 33 / 2 = 784 (query, key) pairs. Request 2 on GPU 1: 12
  // new tokens, 12 * 13 / 2 = 78 pairs. Both in one step, placed together.
  place(pe, de,
        {make(1, 40, 0, pe, de, read_plan{2, 0}),
         make(2, 12, 1, pe, de, read_plan{0, 0})});
  run_until_results(2);
  REQUIRE_EQ(fake->results.size(), 2u);
  // Per layer: the routed experts of all 44 new tokens, 0.5 * 8e8 * 44 / 2
  // = 8.8e9 FLOPs on each GPU. GPU 0: 8.8e9 + 0.5 * 8e8 * 32 + 8192 * 784
  // = 2.16064225e10 FLOPs -> 2.16064225e-3 s at 1e13 FLOP/s. GPU 1: 8.8e9 +
  // 0.5 * 8e8 * 12 + 8192 * 78 = 1.36006390e10 -> 1.3600639e-3 s. The layer
  // waits for GPU 0, plus 1e-4 s: 5 layers of 2.26064225e-3 s.
  const double gpu0 = (8.8e9 + 0.5 * 8e8 * 32 + 8192.0 * 784) / 1e13;
  const double gpu1 = (8.8e9 + 0.5 * 8e8 * 12 + 8192.0 * 78) / 1e13;
  REQUIRE(gpu0 > gpu1);
  auto step = gpu::to_duration(gpu0 + 1e-4).count() * 5;
  // Both requests end with the step (lockstep), whichever GPU held them.
  CHECK_EQ(result(1).ttft_ns, step);
  CHECK_EQ(result(2).ttft_ns, step);
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a request larger than the quota is chunked "
                           "across steps") {
  auto pe_cfg = engine(engine_role::prefill, 1);
  // 40 new tokens, none cached: 820 pairs, 8192 * 820 * 5 layers / 1e13 =
  // 3.36e-6 s of attention. A quota of 1e-6 s holds 244 pairs: chunks of
  // 21 (231 pairs), 9 (21 * 9 + 45 = 234), 7 (30 * 7 + 28 = 238) and the
  // last 3 tokens, one step each.
  pe_cfg.quota_s = 1e-6;
  auto stats = pe_cfg.stats;
  auto pe = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, pe_cfg));
  auto de = caf::actor_cast<caf::actor>(
      spawn_decode_engine(sys, engine(engine_role::decode, 1)));
  sched.run();
  place(pe, de, {make(1, 40, 0, pe, de, read_plan{0, 0})});
  run_until_results(1);
  REQUIRE_EQ(fake->results.size(), 1u);
  CHECK_EQ(stats->steps.load(), 4u);
  CHECK_EQ(stats->chunks.load(), 4u);
  CHECK_EQ(stats->chunked.load(), 1u);
  // TTFT: the four steps back to back, each its own chunk's time.
  auto layer = [](double cached, double n) {
    double pairs = n * cached + n * (n + 1) / 2;
    return gpu::to_duration((8e8 * n + 8192 * pairs) / 1e13 + 1e-4).count();
  };
  auto expected =
      5 * (layer(0, 21) + layer(21, 9) + layer(30, 7) + layer(37, 3));
  CHECK_EQ(result(1).ttft_ns, expected);
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "the engine fetches for its group and reports "
                           "every GPU") {
  auto de = caf::actor_cast<caf::actor>(
      spawn_decode_engine(sys, engine(engine_role::decode, 1)));
  auto pe_cfg = engine(engine_role::prefill, 3);
  pe_cfg.group = 7;
  pe_cfg.fetch_period_ns = 1'000'000;
  auto pe = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, pe_cfg));
  fake->to_hand_out.push_back(make(42, 6, 2, pe, de, read_plan{1, 0}));
  caf::anon_send(caf::actor_cast<decode_engine_actor>(de), assign_atom_v,
                 fake->to_hand_out.back());
  sched.run();
  CHECK(fake->fetches.empty()); // the first fetch waits one period
  run_until_results(1);
  REQUIRE_GE(fake->fetches.size(), 1u);
  auto& g = fake->fetches.front();
  CHECK_EQ(g.group, 7u);
  CHECK_EQ(g.role, engine_role::prefill);
  REQUIRE_EQ(g.engines.size(), 3u);
  for (uint32_t k = 0; k < 3; ++k)
    CHECK_EQ(g.engines[k].engine, (engine_id{"pe", engine_role::prefill, k}));
  REQUIRE_EQ(fake->results.size(), 1u);
  CHECK_EQ(fake->results[0].id, 42u);
  CHECK_EQ(fake->results[0].prefill.rank, 2u);
  // Done: every GPU's load is back to zero.
  group_report load;
  sys.spawn([&load, pe](caf::event_based_actor* q) {
    q->request(caf::actor_cast<prefill_engine_actor>(pe), caf::infinite,
               status_atom_v)
        .then([&load](group_report& x) { load = std::move(x); });
  });
  sched.run();
  REQUIRE_EQ(load.engines.size(), 3u);
  for (auto& x : load.engines) {
    CHECK_EQ(x.seq, 0u);
    CHECK_EQ(x.tok, 0u);
  }
  caf::anon_send_exit(pe, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
  sched.run();
}
