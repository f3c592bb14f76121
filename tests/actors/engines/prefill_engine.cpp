// ctest-label: engines
// The prefill engine's plan per load mode, and, under CAF's test coordinator
// with simulated time, the engines' timing and the group leader's fetch loop.
// Oracle mode needs no storage reader and no bulk transport (no I/O
// threads), so these runs are fully deterministic: TTFT is exactly the
// layers' compute time from the compute model, TTST and completion follow
// the decode TPOT, and the leader reports its load, fetches an assignment and
// dispatches it to the named member.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/decode_engine.hpp"
#include "actors/engines/engine_timing.hpp"
#include "actors/engines/prefill_engine.hpp"
#include "actors/protocol/register.hpp"
#include "gpu/device.hpp"

using namespace dualpath;
using namespace dualpath::actors;

namespace {

caf::actor_system_config& testing_config(caf::actor_system_config& cfg) {
  add_message_types(cfg);
  cfg.set("scheduler.policy", caf::atom("testing"));
  return cfg;
}

struct fake_scheduler_state {
  std::vector<group_report> fetches;
  std::vector<group_report> reports;
  std::vector<request_result> results;
  std::vector<assignment> to_hand_out;
};

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{testing_config(cfg)};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<fake_scheduler_state> fake =
      std::make_shared<fake_scheduler_state>();
  caf::actor scheduler;
  emulated_time time{sched.clock().now(), 1.0};

  fixture() {
    auto f = fake;
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
          [f](report_atom, group_report& g) {
            f->reports.push_back(std::move(g));
          },
      };
    });
  }

  engine_config engine(engine_role role, uint32_t rank = 0) {
    engine_config c;
    c.id = engine_id{role == engine_role::prefill ? "pe" : "de", role, rank};
    c.mode = load_mode::oracle;
    c.model.layers = 5;
    c.model.block_tokens = 4;
    c.model.nominal_bytes_per_token_layer = 64;
    c.model.real_bytes_per_token_layer = 64;
    c.model.active_params = 2e9;
    c.model.attn_heads = 16;
    c.model.attn_qk_dim = 128;
    c.model.attn_v_dim = 128;
    c.time = time;
    c.node = std::make_shared<node_resources>();
    c.node->name = c.id.node;
    gpu::device_options d;
    d.backend = gpu::backend_choice::host;
    d.hbm_budget = 1 << 20;
    auto dev = gpu::make_host_device(d);
    REQUIRE(dev);
    c.device = *dev;
    c.gpu_flops = 1e13;
    c.hbm_bytes = 1 << 20;
    c.dram_buffer_bytes = 1 << 20;
    c.scheduler = scheduler;
    return c;
  }

  // Runs until `n` results arrived, firing timeouts in order (bounded).
  void run_until_results(size_t n) {
    for (int i = 0; i < 100000 && fake->results.size() < n; ++i) {
      sched.run();
      if (fake->results.size() >= n || !sched.trigger_timeout())
        break;
    }
    sched.run();
  }
};

assignment make(uint64_t id, uint32_t tokens, uint32_t gen, caf::actor pe,
                caf::actor de, read_plan plan) {
  assignment a;
  a.request.id = id;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < tokens; ++i)
    ids.push_back(1000 * static_cast<uint32_t>(id) + i);
  a.request.tokens = std::move(ids);
  a.request.gen_tokens = gen;
  a.prefill = engine_id{"pe", engine_role::prefill, 0};
  a.decode = engine_id{"de", engine_role::decode, 0};
  a.plan = plan;
  a.prefill_actor = pe;
  a.decode_actor = de;
  return a;
}

} // namespace

TEST_CASE("each mode applies its own read plan") {
  read_plan scheduled{5, 2};
  auto basic = plan_for(load_mode::basic, scheduled, 10);
  CHECK_EQ(basic.hit_blocks, 5u);
  CHECK_EQ(basic.pe_side_blocks, 5u);
  auto layerwise = plan_for(load_mode::layerwise, scheduled, 10);
  CHECK_EQ(layerwise.pe_side_blocks, 5u);
  auto dual = plan_for(load_mode::dualpath, scheduled, 10);
  CHECK_EQ(dual.hit_blocks, 5u);
  CHECK_EQ(dual.pe_side_blocks, 2u);
  auto oracle = plan_for(load_mode::oracle, scheduled, 10);
  CHECK_EQ(oracle.pe_side_blocks, 0u);
  // Hits never exceed the prompt's full blocks, nor PE-side the hits.
  auto clamped = plan_for(load_mode::dualpath, read_plan{9, 12}, 3);
  CHECK_EQ(clamped.hit_blocks, 3u);
  CHECK_EQ(clamped.pe_side_blocks, 3u);
}

TEST_CASE_FIXTURE(fixture, "simulated time: TTFT is the layers' compute time") {
  auto pe_cfg = engine(engine_role::prefill);
  auto de_cfg = engine(engine_role::decode);
  auto pe = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, pe_cfg));
  auto de = caf::actor_cast<caf::actor>(spawn_decode_engine(sys, de_cfg));
  sched.run();
  // 10 tokens, 2 cached full blocks (8 tokens), 4 generated.
  work_batch w{{make(1, 10, 4, pe, de, read_plan{2, 1})}};
  caf::anon_send(pe, prefill_atom_v, w);
  sched.run();
  // In flight (waiting for layer 0's compute): seq_e 1, tok_e 10 on both.
  std::vector<engine_load> loads;
  sys.spawn([&](caf::event_based_actor* q) {
    for (auto& hdl : {pe, de})
      q->request(hdl, caf::infinite, status_atom_v).then([&](engine_load& x) {
        loads.push_back(x);
      });
  });
  sched.run();
  REQUIRE_EQ(loads.size(), 2u);
  for (auto& x : loads) {
    CHECK_EQ(x.seq, 1u);
    CHECK_EQ(x.tok, 10u);
  }
  run_until_results(1);
  REQUIRE_EQ(fake->results.size(), 1u);
  auto& r = fake->results[0];
  auto layer = gpu::to_duration(
      prefill_layer_seconds(pe_cfg, {gpu::sequence_shape{8, 2}}));
  CHECK_GT(layer.count(), 0);
  CHECK_EQ(r.ttft_ns, 5 * layer.count());
  auto tpot = gpu::to_duration(decode_tpot_seconds(de_cfg, 10 + 2));
  CHECK_EQ(r.tpot_ns, tpot.count());
  CHECK_EQ(r.ttst_ns, r.ttft_ns + tpot.count());
  CHECK_EQ(r.done_ns, r.ttft_ns + 3 * tpot.count());
  CHECK_EQ(r.verify_failures, 0u);
  CHECK_EQ(r.blocks_verified, 3u);
  CHECK_EQ(r.bytes_compute_net, 0u);
  loads.clear();
  sys.spawn([&](caf::event_based_actor* q) {
    for (auto& hdl : {pe, de})
      q->request(hdl, caf::infinite, status_atom_v).then([&](engine_load& x) {
        loads.push_back(x);
      });
  });
  sched.run();
  REQUIRE_EQ(loads.size(), 2u);
  for (auto& x : loads) {
    CHECK_EQ(x.seq, 0u);
    CHECK_EQ(x.tok, 0u);
    CHECK_EQ(x.free_hbm_bytes, uint64_t{1} << 20);
  }
}

TEST_CASE_FIXTURE(fixture, "the decode group leader reports its group") {
  auto member = caf::actor_cast<caf::actor>(
      spawn_decode_engine(sys, engine(engine_role::decode, 1)));
  auto leader_cfg = engine(engine_role::decode, 0);
  leader_cfg.group = 3;
  leader_cfg.group_members = {member};
  leader_cfg.fetch_period_ns = 2'000'000;
  auto leader =
      caf::actor_cast<caf::actor>(spawn_decode_engine(sys, leader_cfg));
  sched.run();
  CHECK(fake->reports.empty());
  for (int i = 0; i < 3; ++i) {
    REQUIRE(sched.trigger_timeout());
    sched.run();
  }
  REQUIRE_EQ(fake->reports.size(), 3u);
  auto& g = fake->reports.back();
  CHECK_EQ(g.group, 3u);
  CHECK_EQ(g.role, engine_role::decode);
  REQUIRE_EQ(g.engines.size(), 2u);
  CHECK_EQ(g.engines[0].engine.rank, 0u);
  CHECK_EQ(g.engines[1].engine.rank, 1u);
  CHECK_EQ(g.engines[1].free_hbm_bytes, uint64_t{1} << 20);
  caf::anon_send_exit(leader, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(member, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "the group leader reports, fetches and dispatches") {
  auto de = caf::actor_cast<caf::actor>(
      spawn_decode_engine(sys, engine(engine_role::decode)));
  // Member rank 1 (no fetch loop of its own), then the leader naming it.
  auto member = caf::actor_cast<caf::actor>(
      spawn_prefill_engine(sys, engine(engine_role::prefill, 1)));
  auto leader_cfg = engine(engine_role::prefill, 0);
  leader_cfg.group = 7;
  leader_cfg.group_members = {member};
  leader_cfg.fetch_period_ns = 1'000'000;
  fake->to_hand_out.push_back(make(42, 6, 2, member, de, read_plan{1, 0}));
  auto leader =
      caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, leader_cfg));
  sched.run();
  CHECK(fake->fetches.empty()); // the first fetch waits one period
  run_until_results(1);
  REQUIRE_GE(fake->fetches.size(), 1u);
  auto& g = fake->fetches.front();
  CHECK_EQ(g.group, 7u);
  CHECK_EQ(g.role, engine_role::prefill);
  REQUIRE_EQ(g.engines.size(), 2u);
  CHECK_EQ(g.engines[0].engine.rank, 0u);
  CHECK_EQ(g.engines[1].engine.rank, 1u);
  REQUIRE_EQ(fake->results.size(), 1u);
  CHECK_EQ(fake->results[0].id, 42u);
  CHECK_EQ(fake->results[0].verify_failures, 0u);
  caf::anon_send_exit(leader, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(member, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
  sched.run();
}
