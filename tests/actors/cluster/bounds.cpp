// ctest-label: run
// The fluid bounds of a replayed trace against a hand computation (two
// agents, known token counts, one of them with a history turn), the bound
// each mode is held to, and the replay window of job_trace: turns = 0 keeps
// every turn of every trajectory (a trace file's own history excepted),
// turns >= 1 the window from each trajectory's middle.
#include "actors/cluster/bounds.hpp"

#include <doctest/doctest.h>

#include "actors/cluster/job.hpp"
#include "config/settings.hpp"
#include "scheduler/workload/generator.hpp"
#include "scheduler/workload/trace_file.hpp"
#include "tests/support/settings.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::actors::cluster;
namespace workload = dualpath::scheduler::workload;
using dualpath::actors::load_mode;

namespace {

// A model small enough to work by hand: 2 layers of 1e9 active parameters
// each, one dense attention head of qk 8 / v 8 dims, 10 B of KV per token
// and layer; 4-token blocks; 1P2D of 2 GPUs at 1 TFLOP/s x 0.5; storage NICs
// of 100 B/s.
cluster_spec tiny_spec() {
  cluster_spec s;
  s.prefill_nodes = 1;
  s.decode_nodes = 2;
  s.gpus_per_node = 2;
  s.snic_bytes_per_s = 100;
  s.block_tokens = 4;
  s.model.name = "tiny";
  s.model.layers = 2;
  s.model.active_params = 2e9;
  s.model.attention_heads = 1;
  s.model.qk_head_dim = 8;
  s.model.v_head_dim = 8;
  s.model.kv_bytes_per_token_layer = 10;
  s.gpu.tflops = 1;
  s.gpu.compute_efficiency = 0.5;
  return s;
}

// Agent 0: turns (append 10, gen 3), (5, 2), nothing in storage.
// Agent 1: turns (7, 1), (2, 9), (3, 1), the first one history.
workload::trace tiny_trace() {
  workload::trajectory a;
  a.agent = 0;
  a.turns = {{10, 3}, {5, 2}};
  workload::trajectory b;
  b.agent = 1;
  b.turns = {{7, 1}, {2, 9}, {3, 1}};
  b.history_turns = 1;
  return {a, b};
}

} // namespace

TEST_CASE("hit tokens are the context before the append, in full blocks") {
  auto t = tiny_trace();
  // Agent 0: turn 0 has no context; turn 1 follows 10 + 3 = 13 tokens: 12.
  CHECK(hit_tokens(t[0], 0, 4) == 0);
  CHECK(hit_tokens(t[0], 1, 4) == 12);
  // Agent 1: turn 1 follows its history (7 + 1 = 8: two blocks); turn 2
  // follows 8 + 2 + 9 = 19 tokens: 16.
  CHECK(hit_tokens(t[1], 1, 4) == 8);
  CHECK(hit_tokens(t[1], 2, 4) == 16);
}

TEST_CASE("the bounds of a tiny trace equal the hand computation") {
  auto b = trace_bounds(tiny_trace(), tiny_spec());
  // Replayed: agent 0 turns 0 and 1, agent 1 turns 1 and 2 (cached, new):
  //   (0, 10), (12, 6), (8, 2), (16, 6)  -> 24 new tokens, 36 hit tokens.
  CHECK(b.hit_tokens == 36);
  // 36 tokens x 10 B x 2 layers.
  CHECK(b.hit_bytes == 720);
  // Per layer: linear 2 x 1e9 x 24 = 4.8e10; attention 2 x 1 x (8 + 8) = 32
  // FLOPs per pair, pairs n c + n (n + 1) / 2 = 55 + 93 + 19 + 117 = 284:
  // 9,088. Two layers: 96,000,018,176 FLOPs.
  CHECK(b.prefill_flops == doctest::Approx(96'000'018'176.0).epsilon(1e-12));
  // 1 node x 2 GPUs x 1e12 x 0.5 = 1e12 FLOP/s.
  CHECK(b.pe_flops_per_s == doctest::Approx(1e12));
  CHECK(b.prefill_compute_s
        == doctest::Approx(0.096'000'018'176).epsilon(1e-12));
  // 720 B over one PE storage NIC of 100 B/s, over three NICs.
  CHECK(b.pe_snic_s == doctest::Approx(7.2));
  CHECK(b.all_snic_s == doctest::Approx(2.4));
}

TEST_CASE("each mode is held to the bound of the paths it reads on") {
  auto b = trace_bounds(tiny_trace(), tiny_spec());
  auto basic = bound_for(b, load_mode::basic);
  CHECK(basic.name == "pe_snic");
  CHECK(basic.s == doctest::Approx(7.2));
  CHECK(bound_for(b, load_mode::layerwise).name == "pe_snic");
  auto dual = bound_for(b, load_mode::dualpath);
  CHECK(dual.name == "all_snic");
  CHECK(dual.s == doctest::Approx(2.4));
  auto oracle = bound_for(b, load_mode::oracle);
  CHECK(oracle.name == "prefill_compute");
  CHECK(oracle.s == doctest::Approx(0.096'000'018'176));
  // Slower GPUs: compute becomes every mode's bound.
  auto slow = tiny_spec();
  slow.gpu.tflops = 0.001; // 1e9 FLOP/s in all -> 96 s
  auto bs = trace_bounds(tiny_trace(), slow);
  for (auto mode : {load_mode::basic, load_mode::dualpath, load_mode::oracle}) {
    CHECK(bound_for(bs, mode).name == "prefill_compute");
    CHECK(bound_for(bs, mode).s == doctest::Approx(96.000'018'176));
  }
  // JCT over the bound; a zero bound gives no ratio.
  mode_report r;
  r.jct_s = 14.4;
  set_bound(r, basic);
  CHECK(r.jct_over_bound == doctest::Approx(2.0));
  set_bound(r, mode_bound{"pe_snic", 0});
  CHECK(r.jct_over_bound == 0);
}

TEST_CASE("turns = 0 replays every turn of every generated trajectory") {
  auto cfg = dualpath::test::settings_with({"workload.agents=12"});
  job_options opts;
  opts.turns = 0;
  auto replayed = job_trace(cfg, opts);
  REQUIRE(replayed);
  // The generator's own trace, untouched: every turn, nothing history.
  auto p = generator_params_from(cfg);
  CHECK(p.agents == 12);
  auto gen = workload::generate(p);
  REQUIRE(gen);
  CHECK(*replayed == *gen);
  for (auto& t : *replayed)
    CHECK(t.history_turns == 0);
  // A window of 3 from the middle instead: history up to the middle.
  opts.turns = 3;
  auto window = job_trace(cfg, opts);
  REQUIRE(window);
  REQUIRE(window->size() == gen->size());
  for (size_t i = 0; i < gen->size(); ++i) {
    auto& full = (*gen)[i];
    auto& w = (*window)[i];
    auto first = std::min(full.turns.size() / 2, full.turns.size() - 1);
    CHECK(w.history_turns == first);
    CHECK(w.turns.size() == std::min(full.turns.size(), first + 3));
  }
}

TEST_CASE("turns = 0 keeps a trace file's own history turns") {
  dualpath::test::temp_dir dir;
  auto path = dir.file("trace.jsonl");
  REQUIRE(!workload::save_trace(path, tiny_trace()));
  auto cfg = dualpath::test::settings_with({});
  job_options opts;
  opts.turns = 0;
  opts.trace_file = path;
  auto replayed = job_trace(cfg, opts);
  REQUIRE(replayed);
  CHECK(*replayed == tiny_trace());
  REQUIRE(replayed->size() == 2);
  CHECK((*replayed)[0].history_turns == 0);
  CHECK((*replayed)[1].history_turns == 1);
}
