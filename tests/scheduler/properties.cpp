// ctest-label: scheduler
// Property tests of the placement policies and the compute quota on seeded
// random inputs (many cases per property). Each decision of a fetch is
// replayed against an independent shadow of the loads, so the properties are
// checked against the rules' text, not against the code under test:
//  - FIFO: a fetch assigns a prefix of the waiting queue; the rest stays, in
//    order; a fetch stops only when every candidate PE is over beta;
//  - no overloaded PE: each request goes to a candidate whose tok_e (with the
//    fetch's earlier assignments) is <= beta; for the paper's policy it is
//    also the min tok_e of the preferred read-queue class;
//  - exactly once: every request is assigned once and placed on a DE once;
//  - no DE over its GPU memory: placements never exceed the free HBM the DE
//    last reported;
//  - reads: the PE part [0, k) and DE part [k, H) cover the hit blocks
//    exactly; split's k is optimal among all integers 0..H;
//  - quota: see compute_quota.hpp's guarantee (checked literally below).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "scheduler/cluster_state.hpp"
#include "scheduler/compute_quota.hpp"
#include "scheduler/policy.hpp"

using namespace dualpath::scheduler;

namespace {

using rng_t = std::mt19937_64;

uint64_t uni(rng_t& rng, uint64_t lo, uint64_t hi) {
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

double unid(rng_t& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

constexpr uint32_t block = 64;

request_info random_request(rng_t& rng, uint64_t id) {
  request_info r;
  r.id = id;
  r.prompt_tokens = static_cast<uint32_t>(uni(rng, 1, 40000));
  uint32_t max_blocks = r.prompt_tokens / block;
  // Mostly high hit ratios (agentic), sometimes none.
  r.hit_blocks =
      uni(rng, 0, 4) == 0
          ? 0
          : static_cast<uint32_t>(uni(rng, max_blocks * 3 / 4, max_blocks));
  r.hit_tokens = r.hit_blocks * block;
  r.gen_tokens = static_cast<uint32_t>(uni(rng, 0, 500));
  r.kv_bytes_per_token = static_cast<uint32_t>(uni(rng, 1, 40));
  return r;
}

struct scenario {
  cluster_state st;
  std::deque<request_info> waiting;
  thresholds th;
  uint64_t next_id = 1;
};

scenario random_scenario(rng_t& rng) {
  scenario s;
  s.th.alpha_tokens = uni(rng, 0, 20000);
  s.th.beta_tokens = uni(rng, 1000, 60000);
  std::vector<node_state> nodes;
  std::vector<engine_state> pes, des;
  auto new_node = [&] {
    nodes.push_back(node_state{uni(rng, 0, 2 * s.th.alpha_tokens + 1),
                               unid(rng, 100, 10000)});
    return static_cast<uint32_t>(nodes.size() - 1);
  };
  auto pe_nodes = uni(rng, 1, 5);
  for (uint64_t n = 0; n < pe_nodes; ++n) {
    auto node = new_node();
    auto k = uni(rng, 1, 8);
    for (uint64_t i = 0; i < k; ++i) {
      engine_state e;
      e.id = static_cast<uint32_t>(pes.size());
      e.group = static_cast<uint32_t>(n);
      e.node = node;
      e.seq = static_cast<uint32_t>(uni(rng, 0, 10));
      e.tok = uni(rng, 0, s.th.beta_tokens * 3 / 2);
      e.read_q = nodes[node].read_q;
      pes.push_back(e);
    }
  }
  auto de_groups = uni(rng, 1, 5);
  for (uint64_t g = 0; g < de_groups; ++g) {
    auto node = new_node();
    auto k = uni(rng, 1, 8);
    for (uint64_t i = 0; i < k; ++i) {
      engine_state e;
      e.id = static_cast<uint32_t>(des.size());
      e.group = static_cast<uint32_t>(g);
      e.node = node;
      e.seq = static_cast<uint32_t>(uni(rng, 0, 20));
      e.tok = uni(rng, 0, 50000);
      e.read_q = nodes[node].read_q;
      e.free_hbm_bytes = uni(rng, 0, 2'000'000);
      des.push_back(e);
    }
  }
  auto made =
      cluster_state::make(std::move(pes), std::move(des), std::move(nodes));
  REQUIRE_MESSAGE(made, (made ? "" : caf::to_string(made.error())));
  s.st = std::move(*made);
  auto n = uni(rng, 1, 300);
  for (uint64_t i = 0; i < n; ++i)
    s.waiting.push_back(random_request(rng, s.next_id++));
  return s;
}

double makespan(const read_split& s, uint64_t qp, double rp, uint64_t qd,
                double rd, uint32_t t) {
  return std::max(
      (static_cast<double>(qp) + double{1} * s.pe_side_blocks * t) / rp,
      (static_cast<double>(qd) + double{1} * s.de_side_blocks() * t) / rd);
}

// Ledger of the whole run: where every request went.
struct ledger {
  std::map<uint64_t, uint32_t> group_of; // assigned request -> decode group
  std::map<uint64_t, uint64_t> need_of;  // request -> decode HBM bytes
  std::set<uint64_t> placed;
  std::vector<int64_t> free_hbm; // shadow free HBM per DE (last report - use)
};

void check_placements(const scenario& s, ledger& led,
                      const std::vector<de_placement>& ps) {
  for (const auto& p : ps) {
    REQUIRE(led.group_of.count(p.request_id) == 1);
    CHECK(s.st.decode[p.decode].group == led.group_of[p.request_id]);
    CHECK(led.placed.insert(p.request_id).second); // placed once
    led.free_hbm[p.decode] -= static_cast<int64_t>(led.need_of[p.request_id]);
    CHECK(led.free_hbm[p.decode] >= 0); // never over the DE's memory
  }
}

// One fetch, checked decision by decision against a shadow replay.
void checked_fetch(scenario& s, placement_policy& pol, policy_kind kind,
                   read_mode mode, const std::vector<uint32_t>& cands,
                   ledger& led) {
  // Shadow of everything the rules read.
  std::vector<uint64_t> tok;
  for (const auto& e : s.st.prefill)
    tok.push_back(e.tok);
  std::vector<uint64_t> q;
  for (const auto& n : s.st.nodes)
    q.push_back(n.read_q);
  std::vector<uint64_t> gtot;
  for (const auto& g : s.st.decode_groups)
    gtot.push_back(g.total_tokens);
  const auto before = s.waiting;
  auto res = pol.fetch(s.st, s.waiting, cands);
  // FIFO: a prefix was assigned, the rest stays in order.
  REQUIRE(res.assigned.size() + s.waiting.size() == before.size());
  for (size_t i = 0; i < res.assigned.size(); ++i)
    REQUIRE(res.assigned[i].request.id == before[i].id);
  for (size_t i = 0; i < s.waiting.size(); ++i)
    REQUIRE(s.waiting[i].id == before[res.assigned.size() + i].id);
  const auto& th = s.th;
  for (const auto& d : res.assigned) {
    const auto& r = d.request;
    // A candidate, not overloaded.
    CHECK(std::find(cands.begin(), cands.end(), d.prefill) != cands.end());
    CHECK(tok[d.prefill] <= th.beta_tokens);
    if (kind == policy_kind::dualpath) {
      bool any_short = false;
      uint64_t min_short = UINT64_MAX, min_long = UINT64_MAX;
      for (auto c : cands) {
        if (tok[c] > th.beta_tokens)
          continue;
        if (q[s.st.prefill[c].node] <= th.alpha_tokens) {
          any_short = true;
          min_short = std::min(min_short, tok[c]);
        } else {
          min_long = std::min(min_long, tok[c]);
        }
      }
      bool chosen_short = q[s.st.prefill[d.prefill].node] <= th.alpha_tokens;
      CHECK(chosen_short == any_short);
      CHECK(tok[d.prefill] == (any_short ? min_short : min_long));
      CHECK(gtot[d.decode_group]
            == *std::min_element(gtot.begin(), gtot.end()));
    }
    // Reads cover the hit blocks exactly once.
    CHECK(d.reads.hit_blocks == r.hit_blocks);
    CHECK(d.reads.pe_side_blocks <= r.hit_blocks);
    CHECK(d.reads.pe_side_blocks + d.reads.de_side_blocks() == r.hit_blocks);
    auto pn = s.st.prefill[d.prefill].node;
    auto dn = s.st.decode_groups[d.decode_group].node;
    if (mode == read_mode::pe_only) {
      CHECK(d.reads.pe_side_blocks == r.hit_blocks);
    } else if (mode == read_mode::shorter_queue) {
      CHECK(d.reads.pe_side_blocks == (q[pn] <= q[dn] ? r.hit_blocks : 0u));
    } else if (r.hit_blocks > 0) {
      double rp = s.st.nodes[pn].read_tokens_per_s;
      double rd = s.st.nodes[dn].read_tokens_per_s;
      double got = makespan(d.reads, q[pn], rp, q[dn], rd, block);
      double best = got;
      for (uint32_t k = 0; k <= r.hit_blocks; ++k)
        best = std::min(best, makespan(read_split{r.hit_blocks, k}, q[pn], rp,
                                       q[dn], rd, block));
      CHECK(got <= best * (1 + 1e-12));
    }
    // Replay.
    tok[d.prefill] += r.prompt_tokens;
    q[pn] += uint64_t{block} * d.reads.pe_side_blocks;
    q[dn] += uint64_t{block} * d.reads.de_side_blocks();
    gtot[d.decode_group] += r.prompt_tokens;
    CHECK(led.group_of.emplace(r.id, d.decode_group).second); // once
    led.need_of[r.id] = r.decode_hbm_bytes();
  }
  // The fetch stops only when no candidate qualifies.
  if (!s.waiting.empty())
    for (auto c : cands)
      CHECK(tok[c] > th.beta_tokens);
  // The shadow and the state agree.
  for (size_t i = 0; i < tok.size(); ++i)
    CHECK(tok[i] == s.st.prefill[i].tok);
  for (size_t i = 0; i < q.size(); ++i)
    CHECK(q[i] == s.st.nodes[i].read_q);
  check_placements(s, led, res.placed);
}

void run_policy_property(policy_kind kind, read_mode mode, uint64_t seed) {
  rng_t rng(seed);
  for (int round = 0; round < 150; ++round) {
    auto s = random_scenario(rng);
    policy_config cfg;
    cfg.kind = kind;
    cfg.limits = s.th;
    cfg.reads = mode;
    auto pol = make_policy(cfg);
    ledger led;
    for (const auto& e : s.st.decode)
      led.free_hbm.push_back(static_cast<int64_t>(e.free_hbm_bytes));
    std::vector<uint64_t> all_ids;
    for (const auto& r : s.waiting)
      all_ids.push_back(r.id);
    auto fetches = uni(rng, 1, 12);
    for (uint64_t f = 0; f < fetches; ++f) {
      // Candidates: all PEs, one group's, or a random subset (maybe empty).
      std::vector<uint32_t> cands;
      auto how = uni(rng, 0, 2);
      auto grp = uni(rng, 0, 4);
      for (uint32_t i = 0; i < s.st.prefill.size(); ++i)
        if (how == 0 || (how == 1 && s.st.prefill[i].group == grp)
            || (how == 2 && uni(rng, 0, 1) == 1))
          cands.push_back(i);
      checked_fetch(s, *pol, kind, mode, cands, led);
      // Engines make progress and report: PEs finish work, queues drain, DEs
      // free HBM; decode groups then place what is pending.
      for (uint32_t i = 0; i < s.st.prefill.size(); ++i)
        if (uni(rng, 0, 1))
          s.st.update_prefill(
              i, s.st.prefill[i].seq / 2, s.st.prefill[i].tok / uni(rng, 1, 4),
              s.st.nodes[s.st.prefill[i].node].read_q / uni(rng, 1, 4));
      for (uint32_t i = 0; i < s.st.decode.size(); ++i)
        if (uni(rng, 0, 1)) {
          auto fr = s.st.decode[i].free_hbm_bytes + uni(rng, 0, 1'000'000);
          s.st.update_decode(i, s.st.decode[i].seq, s.st.decode[i].tok / 2,
                             s.st.nodes[s.st.decode[i].node].read_q / 2, fr);
          led.free_hbm[i] = static_cast<int64_t>(fr);
        }
      for (uint32_t g = 0; g < s.st.decode_groups.size(); ++g)
        if (uni(rng, 0, 1))
          check_placements(s, led, pol->place(s.st, g));
      auto more = uni(rng, 0, 30);
      for (uint64_t i = 0; i < more; ++i) {
        s.waiting.push_back(random_request(rng, s.next_id++));
        all_ids.push_back(s.waiting.back().id);
      }
    }
    // Drain: free everything, fetch from every PE until the queue is empty,
    // place everything. Every request must end assigned and placed once.
    std::vector<uint32_t> all;
    for (uint32_t i = 0; i < s.st.prefill.size(); ++i)
      all.push_back(i);
    for (int guard = 0; guard < 100000 && !s.waiting.empty(); ++guard) {
      for (auto i : all)
        s.st.update_prefill(i, 0, 0, 0);
      for (uint32_t i = 0; i < s.st.decode.size(); ++i) {
        s.st.update_decode(i, 0, 0, 0, uint64_t{1} << 40);
        led.free_hbm[i] = int64_t{1} << 40;
      }
      checked_fetch(s, *pol, kind, mode, all, led);
    }
    for (uint32_t g = 0; g < s.st.decode_groups.size(); ++g)
      check_placements(s, led, pol->place(s.st, g));
    CHECK(s.waiting.empty());
    CHECK(led.group_of.size() == all_ids.size());
    CHECK(led.placed.size() == all_ids.size());
    for (auto id : all_ids)
      CHECK(led.placed.count(id) == 1);
    for (const auto& g : s.st.decode_groups)
      CHECK(g.pending.empty());
  }
}

} // namespace

TEST_CASE("property: dualpath policy with split reads") {
  run_policy_property(policy_kind::dualpath, read_mode::split, 11);
}

TEST_CASE("property: dualpath policy with shorter-queue reads") {
  run_policy_property(policy_kind::dualpath, read_mode::shorter_queue, 12);
}

TEST_CASE("property: basic round-robin policy") {
  run_policy_property(policy_kind::basic, read_mode::pe_only, 13);
}

TEST_CASE("property: round robin with dual-path reads (ablation step)") {
  run_policy_property(policy_kind::basic, read_mode::shorter_queue, 14);
}

TEST_CASE("property: split parts cover the hit blocks and drain together") {
  rng_t rng(21);
  for (int i = 0; i < 20000; ++i) {
    auto qp = uni(rng, 0, 1'000'000);
    auto qd = uni(rng, 0, 1'000'000);
    double rp = unid(rng, 1, 1e6);
    double rd = unid(rng, 1, 1e6);
    auto h = static_cast<uint32_t>(uni(rng, 0, 2000));
    auto t = static_cast<uint32_t>(uni(rng, 1, 256));
    auto s = split_reads(qp, rp, qd, rd, h, t);
    REQUIRE(s.hit_blocks == h);
    REQUIRE(s.pe_side_blocks <= h);
    CHECK(s.pe_side_blocks + s.de_side_blocks() == h);
    // Optimal against its neighbours (makespan is convex in k, so a local
    // optimum is the global one).
    double got = makespan(s, qp, rp, qd, rd, t);
    if (s.pe_side_blocks > 0)
      CHECK(got
            <= makespan(read_split{h, s.pe_side_blocks - 1}, qp, rp, qd, rd, t)
                   * (1 + 1e-12));
    if (s.pe_side_blocks < h)
      CHECK(got
            <= makespan(read_split{h, s.pe_side_blocks + 1}, qp, rp, qd, rd, t)
                   * (1 + 1e-12));
  }
}

TEST_CASE("property: compute quota holds except for one minimal chunk") {
  rng_t rng(31);
  for (int c = 0; c < 300; ++c) {
    attention_predictor predict;
    if (uni(rng, 0, 1)) {
      attention_flop_model m;
      m.layers = static_cast<uint32_t>(uni(rng, 1, 64));
      m.heads = static_cast<uint32_t>(uni(rng, 1, 128));
      m.gpu_flops_per_s = unid(rng, 1e14, 1e15);
      predict = m.predictor();
    } else {
      std::vector<std::pair<double, double>> pts;
      double x = 0, y = unid(rng, 0, 0.01);
      for (int k = 0; k < 8; ++k) {
        pts.emplace_back(x, y);
        x += unid(rng, 1e6, 1e9);
        y += unid(rng, 0, 0.2);
      }
      predict = profiled_attention(pts).predictor();
    }
    double quota = unid(rng, 0.05, 1.0);
    uint64_t min_chunk = uni(rng, 1, 128);
    std::deque<prefill_item> q;
    std::map<uint64_t, prefill_item> orig;
    auto n = uni(rng, 1, 20);
    for (uint64_t i = 0; i < n; ++i) {
      prefill_item it{i, uni(rng, 0, 200000), uni(rng, 1, 8000)};
      q.push_back(it);
      orig[i] = it;
    }
    std::map<uint64_t, uint64_t> done;
    uint64_t last_id = 0;
    for (int guard = 0; guard < 1'000'000 && !q.empty(); ++guard) {
      auto head_before = q.front();
      auto batch = pack_batch(q, predict, quota, min_chunk);
      REQUIRE_FALSE(batch.empty()); // progress every call
      double total = 0;
      for (const auto& ch : batch) {
        CHECK(ch.predicted_s == doctest::Approx(predict(ch.cached, ch.bsz)));
        total += ch.predicted_s;
        // FIFO and contiguous chunks.
        CHECK(ch.id >= last_id);
        last_id = ch.id;
        CHECK(ch.cached == orig[ch.id].cached + done[ch.id]);
        done[ch.id] += ch.bsz;
        CHECK(ch.bsz >= 1);
      }
      // The guarantee, literally: within the quota, or one minimal chunk.
      bool within = total <= quota;
      bool single_minimal =
          batch.size() == 1 && batch[0].id == head_before.id
          && batch[0].bsz == std::min(min_chunk, head_before.remaining);
      CHECK((within || single_minimal));
      // Maximal: a cut chunk could not take one more token, and a next
      // request left behind could not start with a minimal chunk.
      if (within && !q.empty()) {
        const auto& last = batch.back();
        if (q.front().id == last.id)
          CHECK(total - last.predicted_s + predict(last.cached, last.bsz + 1)
                > quota);
        else
          CHECK(total
                    + predict(q.front().cached,
                              std::min(min_chunk, q.front().remaining))
                > quota);
      }
    }
    CHECK(q.empty());
    for (const auto& [id, it] : orig)
      CHECK(done[id] == it.remaining);
  }
}
