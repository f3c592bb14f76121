// ctest-label: scheduler
// Each scheduling rule of brief section 3 on small hand-worked examples. The
// expected results are derived by hand in the comments, from the rule's text,
// not from running the code.
#include <doctest/doctest.h>

#include <caf/sec.hpp>

#include <deque>

#include "scheduler/cluster_state.hpp"
#include "scheduler/compute_quota.hpp"
#include "scheduler/de_selection.hpp"
#include "scheduler/path_choice.hpp"
#include "scheduler/pe_selection.hpp"
#include "scheduler/policy.hpp"
#include "scheduler/round_robin.hpp"
#include "scheduler/thresholds.hpp"

using namespace dualpath::scheduler;

namespace {

engine_state pe(uint32_t id, uint32_t node, uint64_t tok, uint64_t read_q) {
  engine_state e;
  e.id = id;
  e.group = node;
  e.node = node;
  e.tok = tok;
  e.read_q = read_q;
  return e;
}

// A decode engine: pe() on `node` with an empty read queue, then its group,
// sequence number and free HBM.
engine_state de(uint32_t id, uint32_t group, uint32_t node, uint32_t seq,
                uint64_t tok, uint64_t free_hbm) {
  auto e = pe(id, node, tok, 0);
  e.group = group;
  e.seq = seq;
  e.free_hbm_bytes = free_hbm;
  return e;
}

request_info req(uint64_t id, uint32_t len, uint32_t hit_blocks = 0,
                 uint32_t block = 64) {
  request_info r;
  r.id = id;
  r.prompt_tokens = len;
  r.hit_blocks = hit_blocks;
  r.hit_tokens = hit_blocks * block;
  r.kv_bytes_per_token = 1;
  return r;
}

cluster_state make_or_fail(std::vector<engine_state> p,
                           std::vector<engine_state> d,
                           std::vector<node_state> n) {
  auto st = cluster_state::make(std::move(p), std::move(d), std::move(n));
  REQUIRE_MESSAGE(st, (st ? "" : caf::to_string(st.error())));
  return std::move(*st);
}

} // namespace

TEST_CASE("thresholds derive from hardware numbers") {
  // alpha: 50 GB/s SNIC, 40,000 B/token (DS 660B ~40 KB), 3 s:
  // 50e9 * 3 / 4e4 = 3,750,000 tokens.
  CHECK(derive_alpha(50e9, 40000) == 3'750'000u);
  CHECK(derive_alpha(50e9, 40000, 1.0) == 1'250'000u);
  // beta: 204,000 tokens/s per GPU x 5 s = 1,020,000 tokens.
  CHECK(derive_beta(204000) == 1'020'000u);
  // Throughput argument: 1 PFLOP/s at 50% MFU, 1e11 FLOPs per computed token,
  // 2% of each prompt computed: 5e14 / (1e11 * 0.02) = 250,000 tokens/s.
  CHECK(prefill_tokens_per_s(1e15, 0.5, 1e11, 0.02) == doctest::Approx(250000));
  CHECK(read_tokens_per_s(40e9, 20000) == doctest::Approx(2e6));
}

TEST_CASE("cluster_state rejects inconsistent tables") {
  auto why = [](const caf::expected<cluster_state>& x) {
    REQUIRE_FALSE(x);
    CHECK(x.error() == caf::sec::invalid_argument);
    return caf::to_string(x.error());
  };
  CHECK_NE(why(cluster_state::make({pe(0, 3, 0, 0)}, {de(0, 0, 0, 0, 0, 1)},
                                   {node_state{}}))
               .find("names node 3"),
           std::string::npos);
  // A decode group on two nodes cannot be one DE side of a read.
  CHECK_NE(
      why(cluster_state::make({}, {de(0, 0, 0, 0, 0, 1), de(1, 0, 1, 0, 0, 1)},
                              {node_state{}, node_state{}}))
          .find("spans"),
      std::string::npos);
  // Group ids 0 and 2: group 1 is missing.
  CHECK_NE(
      why(cluster_state::make({}, {de(0, 0, 0, 0, 0, 1), de(1, 2, 1, 0, 0, 1)},
                              {node_state{}, node_state{}}))
          .find("dense"),
      std::string::npos);
}

TEST_CASE("PE selection: short-queue class first, min tok_e, beta excludes") {
  // alpha = 100 tokens, beta = 1000 tokens.
  //   PE0 node0 (read_q 50: short)  tok 600
  //   PE1 node1 (read_q 200: long)  tok 100
  //   PE2 node0 (short)             tok 1200 (> beta: excluded)
  //   PE3 node2 (read_q 100: short, <= alpha counts as short) tok 700
  auto st = make_or_fail(
      {pe(0, 0, 600, 50), pe(1, 1, 100, 200), pe(2, 0, 1200, 50),
       pe(3, 2, 700, 100)},
      {}, {node_state{50, 1}, node_state{200, 1}, node_state{100, 1}});
  thresholds th{100, 1000};
  std::vector<uint32_t> all{0, 1, 2, 3};
  auto take = [&](uint32_t len) {
    auto c = choose_prefill(st, all, th);
    if (c)
      commit_prefill(st, *c, req(0, len), 0);
    return c;
  };
  // r1 (300): short class {PE0 600, PE3 700} -> PE0, although PE1 (long
  // queue) has only 100 tokens. PE0 -> 900.
  CHECK(take(300) == 0u);
  // r2: short {PE0 900, PE3 700} -> PE3 -> 1000.
  CHECK(take(300) == 3u);
  // r3: short {PE0 900, PE3 1000} -> PE0 -> 1200 (now over beta).
  CHECK(take(300) == 0u);
  // r4: PE3 has exactly beta (1000 is not > beta): still a candidate -> PE3
  // -> 1300.
  CHECK(take(300) == 3u);
  // r5: every short-queue PE is over beta -> long class: PE1.
  CHECK(take(300) == 1u);
  CHECK(st.prefill[1].tok == 400u);
  CHECK(st.prefill[1].seq == 1u);
  // Overload PE1 too: nothing qualifies, the fetch must stop.
  st.update_prefill(1, 5, 1001, 200);
  CHECK_FALSE(choose_prefill(st, all, th).has_value());
}

TEST_CASE("PE selection: reads committed to a node move it to the long class") {
  // alpha 100. PE0 on node0 (read_q 50) tok 500; PE1 on node1 (read_q 90)
  // tok 0. Both short: PE1 wins on tok. Committing 64 hit tokens read by
  // node1 makes its queue 154 > alpha: PE1 joins the long class, so the next
  // request goes to PE0 although PE1 has fewer tokens (300 vs 500).
  auto st = make_or_fail({pe(0, 0, 500, 50), pe(1, 1, 0, 90)}, {},
                         {node_state{50, 1}, node_state{90, 1}});
  thresholds th{100, 10000};
  std::vector<uint32_t> all{0, 1};
  auto c = choose_prefill(st, all, th);
  REQUIRE(c == 1u);
  commit_prefill(st, 1, req(1, 300, 1), 64);
  CHECK(st.nodes[1].read_q == 154u);
  CHECK(choose_prefill(st, all, th) == 0u);
  // Candidates restrict the choice (a group fetching for its own engines).
  CHECK(choose_prefill(st, {1}, th) == 1u);
}

TEST_CASE("DE selection level 1: the group with the least total tokens") {
  // Totals: g0 500, g1 300, g2 300 -> g1 (tie with g2: lower index).
  auto st = make_or_fail(
      {},
      {de(0, 0, 0, 0, 500, 1), de(1, 1, 1, 0, 300, 1), de(2, 2, 2, 0, 300, 1)},
      {node_state{}, node_state{}, node_state{}});
  CHECK(choose_decode_group(st) == 1u);
  route_to_group(st, 1, req(7, 100));
  // g1 now 400 (pending counts), so g2 (300) is next.
  CHECK(st.decode_groups[1].total_tokens == 400u);
  CHECK(choose_decode_group(st) == 2u);
}

TEST_CASE("DE selection level 2: R, Z, under-Z by seq_e, else min tok_e") {
  // One group, KV 1 B/token, no generation: HBM need = len.
  //   DE0: free 1000, tok 400, seq 1
  //   DE1: free  500, tok 100, seq 3
  //   DE2: free    0, tok  50, seq 0
  // Pending A 300, B 400, C 900. Pooled free 1500: A+B = 700 fits, +C = 1600
  // does not -> R = {A, B}, len 700. Z = 1.05 (700 + 550) / 3 = 437.5.
  auto st = make_or_fail({},
                         {de(0, 0, 0, 1, 400, 1000), de(1, 0, 0, 3, 100, 500),
                          de(2, 0, 0, 0, 50, 0)},
                         {node_state{}});
  for (auto [id, len] : {std::pair{1, 300}, {2, 400}, {3, 900}})
    route_to_group(st, 0, req(id, len));
  CHECK(decode_threshold(st, 0) == doctest::Approx(437.5));
  auto placed = place_in_group(st, 0);
  // A (300): room on DE0, DE1. Under Z: DE1 (100+300 = 400); DE0 700 is not
  //   -> DE1 (the only one under Z). DE1: tok 400, seq 4, free 200.
  // B (400): room on DE0 only; 800 > Z -> min tok among those with room: DE0.
  // C (900): no DE has 900 B free -> stop; C stays pending.
  REQUIRE(placed.size() == 2);
  CHECK(placed[0].request_id == 1u);
  CHECK(placed[0].decode == 1u);
  CHECK(placed[1].request_id == 2u);
  CHECK(placed[1].decode == 0u);
  CHECK(st.decode[1].free_hbm_bytes == 200u);
  CHECK(st.decode[0].free_hbm_bytes == 600u);
  CHECK(st.decode[1].seq == 4u);
  REQUIRE(st.decode_groups[0].pending.size() == 1);
  CHECK(st.decode_groups[0].pending.front().id == 3u);
  // The group total never changed: pending tokens moved into tok_e.
  CHECK(st.decode_groups[0].total_tokens == 550u + 1600u);
}

TEST_CASE("DE selection level 2: min seq_e beats min tok_e under Z") {
  // DE0 tok 100 seq 5, DE1 tok 200 seq 1, both with ample HBM.
  // Pending A 100, B 1000: R = {A, B}, Z = 1.05 (1100 + 300) / 2 = 735.
  // A: DE0 200 <= Z and DE1 300 <= Z -> min seq_e -> DE1 (more tokens!).
  // B: DE0 1100 > Z, DE1 1300 > Z -> none under Z -> min tok_e -> DE0.
  auto st = make_or_fail(
      {}, {de(0, 0, 0, 5, 100, 100000), de(1, 0, 0, 1, 200, 100000)},
      {node_state{}});
  route_to_group(st, 0, req(1, 100));
  route_to_group(st, 0, req(2, 1000));
  auto placed = place_in_group(st, 0);
  REQUIRE(placed.size() == 2);
  CHECK(placed[0].decode == 1u);
  CHECK(placed[1].decode == 0u);
}

TEST_CASE("path choice: the side with the shorter read queue") {
  // PE queue 100 < DE queue 200: the PE reads all 10 blocks.
  CHECK(choose_path(100, 200, 10).pe_side_blocks == 10u);
  // Equal queues: the PE side (its reads feed prefill directly).
  CHECK(choose_path(200, 200, 10).pe_side_blocks == 10u);
  // PE queue longer: the DE reads everything.
  auto s = choose_path(300, 200, 10);
  CHECK(s.pe_side_blocks == 0u);
  CHECK(s.de_side_blocks() == 10u);
}

TEST_CASE("split reads: both queues drain together") {
  // Empty queues, equal rates, 10 blocks: 5 / 5.
  CHECK(split_reads(0, 64, 0, 64, 10, 64).pe_side_blocks == 5u);
  // PE queue 320 tokens (5 blocks), equal rates 64 tok/s:
  // k* = (64 (0 + 640) - 64 * 320) / (64 * 128) = 2.5. k = 2: max(448/64,
  // 512/64) = 8 s; k = 3: max(512/64, 448/64) = 8 s: a tie -> the PE side
  // gets more: 3.
  CHECK(split_reads(320, 64, 0, 64, 10, 64).pe_side_blocks == 3u);
  // PE reads twice as fast, empty queues, 9 blocks: k* = 128 * 576 /
  // (64 * 192) = 6 -> 6 PE (384 / 128 = 3 s), 3 DE (192 / 64 = 3 s).
  CHECK(split_reads(0, 128, 0, 64, 9, 64).pe_side_blocks == 6u);
  // A PE queue far longer than the whole request: everything on the DE.
  CHECK(split_reads(100000, 64, 0, 64, 10, 64).pe_side_blocks == 0u);
  // No hit: nothing to read.
  auto s = split_reads(0, 64, 0, 64, 0, 64);
  CHECK(s.hit_blocks == 0u);
  CHECK(s.pe_side_blocks == 0u);
}

TEST_CASE("dualpath fetch: FIFO prefix, reads charged to both nodes") {
  // 1 PE (node0, rate 64 tok/s), 1 DE group (node1, rate 64 tok/s). alpha big,
  // beta 1000. Requests: A len 640 with 10 hit blocks of 64, B len 640, C 640.
  // A: PE tok 0 -> PE0; queues 0/0 -> split 5/5: node0 += 320, node1 += 320;
  //    PE tok 640.
  // B: PE tok 640 <= beta -> PE0; queues 320/320 -> 5/5; PE tok 1280 > beta.
  // C: PE over beta -> stop; C stays at the head.
  auto st = make_or_fail({pe(0, 0, 0, 0)}, {de(0, 0, 1, 0, 0, 1 << 20)},
                         {node_state{0, 64}, node_state{0, 64}});
  policy_config cfg;
  cfg.limits = thresholds{1 << 30, 1000};
  auto pol = make_policy(cfg);
  std::deque<request_info> waiting{req(1, 640, 10), req(2, 640, 10),
                                   req(3, 640, 10)};
  auto res = pol->fetch(st, waiting, {0});
  REQUIRE(res.assigned.size() == 2);
  CHECK(res.assigned[0].request.id == 1u);
  CHECK(res.assigned[0].reads.pe_side_blocks == 5u);
  CHECK(res.assigned[1].reads.pe_side_blocks == 5u);
  CHECK(st.nodes[0].read_q == 640u);
  CHECK(st.nodes[1].read_q == 640u);
  REQUIRE(waiting.size() == 1);
  CHECK(waiting.front().id == 3u);
  // Both fit the DE's HBM: placed during the fetch.
  REQUIRE(res.placed.size() == 2);
  CHECK(res.placed[0].request_id == 1u);
  // Shorter-queue mode puts each request's reads on one side: A on the PE
  // (tie), then the PE queue (640) is longer than the DE's (0): B on the DE.
  auto st2 = make_or_fail({pe(0, 0, 0, 0)}, {de(0, 0, 1, 0, 0, 1 << 20)},
                          {node_state{0, 64}, node_state{0, 64}});
  cfg.reads = read_mode::shorter_queue;
  auto pol2 = make_policy(cfg);
  std::deque<request_info> w2{req(1, 640, 10), req(2, 640, 10)};
  auto res2 = pol2->fetch(st2, w2, {0});
  REQUIRE(res2.assigned.size() == 2);
  CHECK(res2.assigned[0].reads.pe_side_blocks == 10u);
  CHECK(res2.assigned[1].reads.pe_side_blocks == 0u);
}

TEST_CASE("basic mode: round robin, PE-only reads") {
  // 3 PEs, beta 1000; PE1 already over beta. Requests of 100 tokens, 2 hit
  // blocks. Round robin from PE0: r1 PE0, r2 skips PE1 -> PE2, r3 PE0, r4 PE2.
  // Two DE groups: alternate g0, g1, g0, g1. Every hit block on the PE side.
  auto st =
      make_or_fail({pe(0, 0, 0, 0), pe(1, 0, 5000, 0), pe(2, 0, 0, 0)},
                   {de(0, 0, 1, 0, 0, 1 << 20), de(1, 1, 2, 0, 0, 1 << 20)},
                   {node_state{}, node_state{}, node_state{}});
  auto pol = make_policy(policy_config::basic(thresholds{0, 1000}));
  std::deque<request_info> waiting;
  for (uint64_t i = 1; i <= 4; ++i)
    waiting.push_back(req(i, 100, 2));
  auto res = pol->fetch(st, waiting, {0, 1, 2});
  REQUIRE(res.assigned.size() == 4);
  uint32_t want_pe[] = {0, 2, 0, 2};
  uint32_t want_g[] = {0, 1, 0, 1};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(res.assigned[i].prefill == want_pe[i]);
    CHECK(res.assigned[i].decode_group == want_g[i]);
    CHECK(res.assigned[i].reads.pe_side_blocks == 2u);
  }
  CHECK(st.nodes[0].read_q == 4u * 128u);
  CHECK(res.placed.size() == 4);
}

TEST_CASE("a fetch's placements follow the FIFO, across decode groups") {
  // 1 PE, two DE groups on nodes 1 and 2, room for everything. Requests
  // r1..r6 alternate between the groups (level 1: least total tokens, ties
  // to the lower index: g0, g1, g0, ...). Each group is placed after the
  // loop, group by group; the prefill engine starts reads in the order it
  // receives them, so `placed` must come back as r1..r6, not r1, r3, r5,
  // r2, r4, r6 (measured: the second group's reads then queued behind the
  // whole first group at the prefill node, DS 27B 1P2D JCT +9%). A
  // request placed now but assigned by an earlier fetch goes first.
  for (auto kind : {policy_kind::dualpath, policy_kind::basic}) {
    CAPTURE(to_string(kind));
    auto st =
        make_or_fail({pe(0, 0, 0, 0)},
                     {de(0, 0, 1, 0, 0, 1 << 20), de(1, 1, 2, 0, 0, 1 << 20)},
                     {node_state{0, 64}, node_state{0, 64}, node_state{0, 64}});
    policy_config cfg =
        kind == policy_kind::basic
            ? policy_config::basic(thresholds{0, 1 << 30})
            : policy_config::dualpath(thresholds{1 << 30, 1 << 30});
    auto pol = make_policy(cfg);
    // r100: assigned by an earlier fetch to g0 (the tie), pending there
    // while its engine has no room.
    st.decode[0].free_hbm_bytes = 0;
    std::deque<request_info> first{req(100, 64, 1)};
    auto before = pol->fetch(st, first, {0});
    REQUIRE(before.assigned.size() == 1);
    CHECK(before.assigned[0].decode_group == 0u);
    CHECK(before.placed.empty());
    st.decode[0].free_hbm_bytes = 1 << 20;
    std::deque<request_info> waiting;
    for (uint64_t i = 1; i <= 6; ++i)
      waiting.push_back(req(i, 64, 1));
    auto res = pol->fetch(st, waiting, {0});
    REQUIRE(res.assigned.size() == 6);
    std::vector<uint64_t> got;
    for (auto& p : res.placed)
      got.push_back(p.request_id);
    CHECK(got == std::vector<uint64_t>{100, 1, 2, 3, 4, 5, 6});
    // The two groups really were both used.
    CHECK(res.assigned[0].decode_group != res.assigned[1].decode_group);
  }
}

TEST_CASE("compute quota: pack FIFO, cut the overflowing request") {
  // Predictor: seconds = attention pairs (1 layer, 1 head, dims 1 + 1: 4 FLOPs
  // per pair at 4 FLOP/s). Quota 100.
  attention_flop_model m{1, 1, 1, 1, 4.0};
  CHECK(m.seconds(0, 10) == doctest::Approx(55)); // 10 * 11 / 2
  std::deque<prefill_item> q{{1, 0, 10}, {2, 20, 5}, {3, 0, 4}};
  // A (0, 10) = 55. B whole (20, 5) = 100 + 15 = 115: 170 > 100. Largest b
  // with 20 b + b (b + 1) / 2 <= 45: b = 2 (43), b = 3 is 66. So A + B(20, 2),
  // total 98; B stays with cached 22, remaining 3.
  auto b1 = pack_batch(q, m.predictor(), 100);
  REQUIRE(b1.size() == 2);
  CHECK(b1[0].bsz == 10u);
  CHECK(b1[1].id == 2u);
  CHECK(b1[1].cached == 20u);
  CHECK(b1[1].bsz == 2u);
  REQUIRE(q.front().id == 2u);
  CHECK(q.front().cached == 22u);
  CHECK(q.front().remaining == 3u);
  // Next: B (22, 3) = 66 + 6 = 72; C (0, 4) = 10 -> 82: both whole.
  auto b2 = pack_batch(q, m.predictor(), 100);
  REQUIRE(b2.size() == 2);
  CHECK(b2[0].bsz == 3u);
  CHECK(b2[1].bsz == 4u);
  CHECK(q.empty());
  // A head whose single token already costs more than the quota (cached
  // 1000: 1001 > 100) runs alone as a minimal chunk, so work progresses.
  std::deque<prefill_item> big{{9, 1000, 50}, {10, 0, 1}};
  auto b3 = pack_batch(big, m.predictor(), 100);
  REQUIRE(b3.size() == 1);
  CHECK(b3[0].bsz == 1u);
  CHECK(b3[0].predicted_s == doctest::Approx(1001));
  CHECK(big.front().remaining == 49u);
}

TEST_CASE("compute quota: a profiled table replaces the FLOP model") {
  // Points (pairs, s): (0, 0), (100, 1), (200, 3). Query (0, 15): pairs =
  // 120 -> 1 + 20 * 2 / 100 = 1.4. Beyond the table (0, 24): 300 pairs ->
  // extrapolates the last segment: 3 + 100 * 0.02 = 5.
  profiled_attention p({{200, 3.0}, {0, 0.0}, {100, 1.0}});
  CHECK(p.seconds(0, 15) == doctest::Approx(1.4));
  CHECK(p.seconds(0, 24) == doctest::Approx(5.0));
  // Packing with it, quota 2 s: (0, 15) = 1.4 fits; (0, 15) again would be
  // 2.8: cut to the largest b with 1.4 + t(b) <= 2: t(b) <= 0.6 -> pairs <=
  // 60 -> b (b + 1) / 2 <= 60 -> b = 10 (55 pairs, 0.55 s).
  std::deque<prefill_item> q{{1, 0, 15}, {2, 0, 15}};
  auto b = pack_batch(q, p.predictor(), 2.0);
  REQUIRE(b.size() == 2);
  CHECK(b[1].bsz == 10u);
}
