// ctest-label: engines
// ctest-links: actors_storage
// The decode engine under CAF's test coordinator (simulated time, exact):
// its GPUs decode in batches whose step is the roofline of the batch worked
// here by hand (memory-bound alone, compute-bound four at a time); a
// decode-side read starts when the request is placed, before any prefill
// engine asks for room; the node reports every GPU's load, committed HBM
// included. The test plays the prefill engine's part of the protocol.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/engines/decode/decode_engine.hpp"
#include "actors/protocol/register.hpp"
#include "actors/storage/storage_reader.hpp"
#include "gpu/device.hpp"
#include "tests/actors/engines/engine_fixture.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/kv_content.hpp"
#include "transport/storage/modeled_backend.hpp"

using namespace dualpath;
using namespace dualpath::actors;
namespace storage = transport::storage;

namespace {

struct outcomes {
  std::vector<request_result> results;
  std::vector<group_report> reports;
};

struct fixture : test::coordinator_fixture {
  std::shared_ptr<outcomes> out = std::make_shared<outcomes>();
  caf::actor scheduler;

  fixture() {
    auto o = out;
    scheduler = sys.spawn([o](caf::event_based_actor*) -> caf::behavior {
      return {
          [o](done_atom, request_result& r) { o->results.push_back(r); },
          [o](report_atom, group_report& g) { o->reports.push_back(g); },
          [](fail_atom, request_failure&) { FAIL("a request failed"); },
      };
    });
  }

  // The toy model of engine_fixture.hpp on a decode node.
  engine_config engine(load_mode mode, uint32_t gpus = 1) {
    auto c = test::toy_engine(engine_role::decode, gpus, time, scheduler);
    c.mode = mode;
    c.hbm_kv_bytes = 1'000'000;
    return c;
  }

  static assignment make(uint64_t id, uint32_t tokens, uint32_t gen,
                         uint32_t rank, caf::actor de, read_plan plan = {}) {
    assignment a;
    a.request.id = id;
    a.request.tokens = test::toy_tokens(id, tokens);
    a.request.gen_tokens = gen;
    a.prefill = engine_id{"pe", engine_role::prefill, 0};
    a.decode = engine_id{"de", engine_role::decode, rank};
    a.plan = plan;
    a.decode_actor = de;
    return a;
  }

  // Plays the prefill engine for `batch`: placement and admission of each,
  // then every request's summary and layers at one instant (their prefill
  // ends together), `bytes_per_token` per layer each (0: not timed).
  void prefill(const decode_engine_actor& de, std::vector<assignment> batch,
               uint32_t layers, uint64_t bytes_per_token = 0) {
    for (auto& a : batch) {
      caf::anon_send(de, assign_atom_v, a);
      bool slot = false;
      sys.spawn([&slot, de, a](caf::event_based_actor* q) {
        q->request(de, caf::infinite, admit_atom_v, a)
            .then([&slot](decode_slot&) { slot = true; });
      });
      sched.run();
      REQUIRE(slot);
    }
    for (auto& a : batch) {
      auto id = a.request.id;
      auto tokens = static_cast<uint32_t>(a.request.tokens.size());
      caf::anon_send(de, prefilled_atom_v, prefill_summary{id, 0, 0, 0, 0});
      for (uint32_t l = 0; l < layers; ++l)
        caf::anon_send(
            de, layer_atom_v,
            layer_batch{
                l,
                0,
                {layer_chunk{id, 0, tokens, tokens * bytes_per_token, {}}}});
    }
    sched.run();
  }

  void run_until_results(size_t n) {
    test::run_until(sched, [&] { return out->results.size() >= n; });
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "TPOT is the roofline of the batch, worked by "
                           "hand") {
  // One decode step of a sequence of 40 tokens attends to 41 keys in every
  // layer. Memory per layer: weights 1e9 / 5 = 2e8 B plus KV 41 * 64 = 2624
  // B, at 1e12 B/s: 2.00002624e-4 s. Compute per layer: 8e8 linear + 8192 *
  // 41 = 335872 attention FLOPs at 1e13 FLOP/s: 8.00335872e-5 s. Alone the
  // step is memory-bound: (2.00002624e-4 + 1e-4 overhead) * 5 layers.
  const double alone = (2.00002624e-4 + 1e-4) * 5;
  // Four such sequences on one GPU: memory 2e8 + 4 * 2624 B = 2.00010496e-4
  // s; compute 4 * (8e8 + 335872) FLOPs = 3.201343488e-4 s: compute-bound,
  // (3.201343488e-4 + 1e-4) * 5.
  const double four = (3.201343488e-4 + 1e-4) * 5;
  for (uint32_t batch : {1u, 4u}) {
    CAPTURE(batch);
    out->results.clear();
    auto de = spawn_decode_engine(sys, engine(load_mode::oracle));
    sched.run();
    auto hdl = caf::actor_cast<caf::actor>(de);
    // gen_tokens 2: the first token comes with the prefill, the second
    // after exactly one decode step.
    std::vector<assignment> xs;
    for (uint64_t k = 1; k <= batch; ++k)
      xs.push_back(make(k, 40, 2, 0, hdl));
    prefill(de, xs, 5);
    run_until_results(batch);
    REQUIRE_EQ(out->results.size(), batch);
    for (auto& r : out->results) {
      auto expected = batch == 1 ? alone : four;
      CHECK_EQ(r.tpot_ns, gpu::to_duration(expected).count());
      CHECK_EQ(r.ttst_ns - r.ttft_ns, gpu::to_duration(expected).count());
      CHECK_EQ(r.done_ns - r.ttft_ns, r.ttst_ns - r.ttft_ns);
    }
    caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
    sched.run();
  }
  CHECK_GT(four, alone); // TPOT grows with the batch
}

TEST_CASE_FIXTURE(fixture, "the node's GPUs step together: the slowest "
                           "GPU's batch sets the step") {
  // GPU 0 decodes one sequence, GPU 1 four: both take the four's step.
  const double four = (3.201343488e-4 + 1e-4) * 5;
  auto de = spawn_decode_engine(sys, engine(load_mode::oracle, 2));
  sched.run();
  auto hdl = caf::actor_cast<caf::actor>(de);
  std::vector<assignment> xs{make(1, 40, 2, 0, hdl)};
  for (uint64_t k = 2; k <= 5; ++k)
    xs.push_back(make(k, 40, 2, 1, hdl));
  prefill(de, xs, 5);
  run_until_results(5);
  REQUIRE_EQ(out->results.size(), 5u);
  for (auto& r : out->results)
    CHECK_EQ(r.tpot_ns, gpu::to_duration(four).count());
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a decode-side read starts when the request is "
                           "placed, before any slot exists") {
  // The node's buffer: a modeled store holding 3 blocks of the prompt, a
  // reader reading inline (simulated time) into a pool of 64 slots.
  storage::kv_geometry geo{5, 4, 64};
  auto opened =
      storage::block_store::open(storage::store_config{"sim-store", "m", geo},
                                 storage::make_modeled_backend());
  REQUIRE(opened);
  std::shared_ptr<storage::block_store> store{std::move(*opened)};
  auto c = engine(load_mode::dualpath);
  auto a = make(7, 14, 2, 0, caf::actor{}, read_plan{3, 0});
  std::vector<uint32_t> prompt(a.request.tokens.begin(),
                               a.request.tokens.begin() + 12);
  REQUIRE(storage::populate(*store, {prompt}));
  auto pool =
      storage::buffer_pool::make(64 * geo.file_bytes(), geo.file_bytes());
  REQUIRE(pool);
  auto counters = std::make_shared<storage_reader_counters>();
  storage_reader_config rc;
  rc.node = "de";
  rc.store = store;
  rc.pool = *pool;
  rc.io_threads = 0;
  rc.modeled_reads = true;
  rc.lease_runs = true;
  rc.counters = counters;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  c.node->reader = *reader;
  c.node->pool = *pool;
  c.node->store = store;
  auto de = spawn_decode_engine(sys, c);
  sched.run();
  auto hdl = caf::actor_cast<caf::actor>(de);
  a.decode_actor = hdl;
  // Placed: no prefill engine has asked for room, nothing was reserved.
  caf::anon_send(de, assign_atom_v, a);
  sched.run();
  for (int i = 0; i < 1000 && counters->blocks_read.load() < 3; ++i) {
    sched.trigger_timeout(); // the reads' paced completions
    sched.run();
  }
  CHECK_EQ(counters->blocks_read.load(), 3u);
  // Its GPU committed the request's HBM: (14 + 2) tokens x 5 layers x 64 B.
  group_report load;
  sys.spawn([&load, de](caf::event_based_actor* q) {
    q->request(de, caf::infinite, status_atom_v).then([&load](group_report& g) {
      load = std::move(g);
    });
  });
  sched.run();
  REQUIRE_EQ(load.engines.size(), 1u);
  CHECK_EQ(load.engines[0].seq, 1u);
  CHECK_EQ(load.engines[0].tok, 14u);
  CHECK_EQ(load.engines[0].free_hbm_bytes, 1'000'000u - 16u * 5 * 64);
  // The admission finds the read done: the slot comes at once, without the
  // read's blocks failing.
  bool slot = false;
  sys.spawn([&slot, de, a](caf::event_based_actor* q) {
    q->request(de, caf::infinite, admit_atom_v, a)
        .then([&slot](decode_slot& s) {
          slot = true;
          CHECK(s.failed.empty());
        });
  });
  sched.run();
  CHECK(slot);
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(*reader, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "the node reports every GPU's load") {
  auto c = engine(load_mode::oracle, 3);
  c.group = 5;
  c.fetch_period_ns = 2'000'000;
  auto de = spawn_decode_engine(sys, c);
  sched.run();
  CHECK(out->reports.empty());
  for (int i = 0; i < 3; ++i) {
    REQUIRE(sched.trigger_timeout());
    sched.run();
  }
  REQUIRE_EQ(out->reports.size(), 3u);
  auto& g = out->reports.back();
  CHECK_EQ(g.group, 5u);
  CHECK_EQ(g.role, engine_role::decode);
  REQUIRE_EQ(g.engines.size(), 3u);
  for (uint32_t k = 0; k < 3; ++k) {
    CHECK_EQ(g.engines[k].engine, (engine_id{"de", engine_role::decode, k}));
    CHECK_EQ(g.engines[k].free_hbm_bytes, 1'000'000u);
  }
  caf::anon_send_exit(de, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a prompt's copy into GPU memory shares the "
                           "node's DRAM with arriving layers, layer by "
                           "layer") {
  // DRAM of 1e6 B/s (1 B per microsecond), unpaced NICs. Request 1: 400
  // tokens, 400 x 64 B = 25.6 ms of DRAM per layer: its 5 layers land by
  // 128 ms, then its copy into GPU memory takes 5 x 25.6 ms more. Request
  // 2 (40 tokens, 2.56 ms per layer) arrives while that copy runs.
  // The node's buffer: a reader (modeled, inline) on a pool of 256 slots;
  // nothing is read on the decode side, every block is a reservation.
  storage::kv_geometry geo{5, 4, 64};
  auto opened =
      storage::block_store::open(storage::store_config{"sim-store", "m", geo},
                                 storage::make_modeled_backend());
  REQUIRE(opened);
  std::shared_ptr<storage::block_store> store{std::move(*opened)};
  auto pool =
      storage::buffer_pool::make(256 * geo.file_bytes(), geo.file_bytes());
  REQUIRE(pool);
  storage_reader_config rc;
  rc.node = "de";
  rc.store = store;
  rc.pool = *pool;
  rc.io_threads = 0;
  rc.modeled_reads = true;
  rc.lease_runs = true;
  rc.counters = std::make_shared<storage_reader_counters>();
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  auto c = engine(load_mode::dualpath);
  c.node->reader = *reader;
  c.node->pool = *pool;
  c.node->store = store;
  c.node->dram = std::make_shared<emulated_link>("dram", 1'000'000);
  auto de = spawn_decode_engine(sys, c);
  sched.run();
  auto hdl = caf::actor_cast<caf::actor>(de);
  auto now_ns = [&] { return time.since_start_ns(sched.clock().now()); };
  prefill(de, {make(1, 400, 2, 0, hdl)}, 5, 64);
  // To request 1's prefill end (128 ms): its copy starts.
  CHECK_EQ(now_ns(), 0);
  while (now_ns() < 128'000'000) {
    REQUIRE(sched.trigger_timeout());
    sched.run();
  }
  CHECK_EQ(now_ns(), 128'000'000);
  prefill(de, {make(2, 40, 2, 0, hdl)}, 5, 64);
  run_until_results(2);
  REQUIRE_EQ(out->results.size(), 2u);
  auto& first = out->results[0].id == 1 ? out->results[0] : out->results[1];
  auto& second = out->results[0].id == 2 ? out->results[0] : out->results[1];
  // Request 2's layers wait for the layer of the copy under way (to 153.6
  // ms), not for the whole copy (to 256 ms): they land by 153.6 + 5 x 2.56
  // = 166.4 ms, its prefill end.
  CHECK_EQ(second.ttft_ns, 166'400'000);
  // Request 1's copy still takes its 128 ms of DRAM, and request 2's 12.8
  // ms of arrivals come between: it is in GPU memory at 268.8 ms at the
  // earliest (its second token is a decode step later).
  CHECK_EQ(first.ttft_ns, 128'000'000);
  CHECK_GT(first.ttst_ns, 268'800'000);
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(*reader, caf::exit_reason::user_shutdown);
  sched.run();
}
