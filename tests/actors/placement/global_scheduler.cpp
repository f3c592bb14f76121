// ctest-label: scheduler
// The scheduler actor tracks every request to completion: each submitted
// request is assigned to exactly one prefill engine and one decode engine,
// whether it is placed during its fetch or later by a decode report, and its
// submitter gets exactly one result. Real actors on the real scheduler.
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <set>

#include <caf/all.hpp>

#include "actors/placement/global_scheduler.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "actors/protocol/register.hpp"
#include "tests/actors/actor_config.hpp"
#include "transport/errors.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/kv_content.hpp"
#include "transport/storage/modeled_backend.hpp"

using namespace dualpath;
using namespace dualpath::actors;

namespace {

constexpr auto timeout = std::chrono::seconds(10);

// Assignments pushed to the fake prefill engines, by engine rank/node.
struct pushes {
  std::mutex mtx;
  std::vector<assignment> items;
};

prefill_engine_actor::behavior_type fake_pe(std::shared_ptr<pushes> out) {
  return {
      [out](prefill_atom, const work_batch& w) {
        std::lock_guard<std::mutex> guard{out->mtx};
        for (auto& a : w.items)
          out->items.push_back(a);
      },
      [](status_atom) { return group_report{}; },
  };
}

struct fixture {
  test::actor_config cfg{"sharing"};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<pushes> pushed = std::make_shared<pushes>();
  scheduler_actor sched;
  std::vector<engine_id> pes;
  std::vector<engine_id> des;

  explicit fixture(
      std::shared_ptr<transport::storage::block_store> store = nullptr) {
    scheduler_config sc;
    sc.store = std::move(store);
    sc.policy.kind = scheduler::policy_kind::dualpath;
    sc.policy.reads = scheduler::read_mode::split;
    sc.policy.limits.alpha_tokens = 1'000'000;
    sc.policy.limits.beta_tokens = 1'000'000;
    sc.block_tokens = 64;
    sc.kv_bytes_per_token = 1000;
    // Two prefill nodes (groups 0, 1) with two engines each; one decode
    // node (group 0) with two engines.
    for (uint32_t n = 0; n < 2; ++n)
      for (uint32_t r = 0; r < 2; ++r) {
        engine_id id{"pe" + std::to_string(n), engine_role::prefill, r};
        pes.push_back(id);
        sc.prefill.push_back(scheduled_engine{id, n, n});
      }
    for (uint32_t r = 0; r < 2; ++r) {
      engine_id id{"de0", engine_role::decode, r};
      des.push_back(id);
      sc.decode.push_back(scheduled_engine{id, 0, 2});
    }
    sc.nodes.assign(3, scheduler::node_state{0, 1e6});
    auto hdl = spawn_scheduler(sys, sc);
    REQUIRE_MESSAGE(hdl, (hdl ? "" : sys.render(hdl.error())));
    sched = *hdl;
    for (auto& id : pes) {
      engines.push_back(
          caf::actor_cast<caf::actor>(sys.spawn(fake_pe, pushed)));
      enroll(id, engines.back());
    }
    for (auto& id : des) {
      engines.push_back(
          sys.spawn([]() -> caf::behavior { return {[](int) {}}; }));
      enroll(id, engines.back());
    }
  }

  std::vector<caf::actor> engines; // fake engines, stopped with the fixture

  ~fixture() {
    self->send_exit(sched, caf::exit_reason::user_shutdown);
    for (auto& e : engines)
      self->send_exit(e, caf::exit_reason::user_shutdown);
  }

  void enroll(const engine_id& id, caf::actor hdl, uint64_t free_hbm = 0) {
    bool ok = false;
    self->request(sched, timeout, enroll_atom_v,
                  engine_registration{id, 0, hdl, free_hbm})
        .receive([&](bool x) { ok = x; },
                 [&](caf::error& err) { FAIL(sys.render(err)); });
    REQUIRE(ok);
  }

  work_batch fetch(uint32_t group) {
    group_report rep;
    rep.group = group;
    rep.role = engine_role::prefill;
    for (auto& id : pes)
      if (id.node == "pe" + std::to_string(group))
        rep.engines.push_back(engine_load{id, 0, 0, 0, 0, 0});
    work_batch out;
    self->request(sched, timeout, fetch_atom_v, rep)
        .receive([&](work_batch& w) { out = std::move(w); },
                 [&](caf::error& err) { FAIL(sys.render(err)); });
    return out;
  }

  // Submits `spec` (the reply goes to a dead letter) and returns its
  // assignment once placed.
  assignment place(request_spec spec) {
    auto id = spec.id;
    caf::anon_send(sched, submit_atom_v, std::move(spec));
    for (int i = 0; i < 400; ++i) {
      report_decode(1ull << 40);
      for (uint32_t g = 0; g < 2; ++g)
        for (auto& a : fetch(g).items)
          if (a.request.id == id)
            return a;
      {
        std::lock_guard<std::mutex> guard{pushed->mtx};
        for (auto& a : pushed->items)
          if (a.request.id == id)
            return a;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL("request " << id << " was never placed");
    return {};
  }

  // Polls both groups' fetches and the pushes (each assignment once) until
  // some arrive or `tries` rounds of 5 ms pass.
  std::vector<assignment> take_assigned(int tries = 200) {
    std::vector<assignment> got;
    for (int i = 0; i < tries && got.empty(); ++i) {
      for (uint32_t g = 0; g < 2; ++g)
        for (auto& a : fetch(g).items)
          got.push_back(a);
      {
        std::lock_guard<std::mutex> guard{pushed->mtx};
        for (; taken < pushed->items.size(); ++taken)
          got.push_back(pushed->items[taken]);
      }
      if (got.empty())
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return got;
  }
  size_t taken = 0; // pushes take_assigned() returned

  void report_decode(uint64_t free_hbm) {
    group_report rep;
    rep.group = 0;
    rep.role = engine_role::decode;
    for (auto& id : des)
      rep.engines.push_back(engine_load{id, 0, 0, 0, 0, free_hbm});
    self->send(sched, report_atom_v, rep);
  }
};

request_spec make_request(uint64_t id) {
  request_spec r;
  r.id = id;
  r.agent = id;
  r.tokens = std::vector<uint32_t>(100 + id, 7);
  r.gen_tokens = 10;
  return r;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "every request is assigned once and answered once") {
  // A client actor submits 8 requests and collects the results.
  auto results = std::make_shared<std::multiset<uint64_t>>();
  auto results_mtx = std::make_shared<std::mutex>();
  auto client = sys.spawn([=, s = sched](caf::event_based_actor* c) {
    for (uint64_t i = 1; i <= 8; ++i)
      c->request(s, caf::infinite, submit_atom_v, make_request(i))
          .then([=](const request_result& r) {
            std::lock_guard<std::mutex> guard{*results_mtx};
            results->insert(r.id);
          });
  });
  // Let the submissions arrive (they are ordered before our later messages
  // only per sender, so poll the scheduler until it has all of them).
  std::vector<assignment> got;
  // Decode engines have not reported yet: nothing fits, nothing is placed,
  // but the requests are assigned to prefill engines and kept.
  for (int i = 0; i < 100 && got.empty(); ++i) {
    auto w = fetch(0);
    for (auto& a : w.items)
      got.push_back(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(got.empty());
  // A decode report with room places the pending requests; those of group 1
  // are pushed to their engines, those of group 0 come with the next fetch
  // or are pushed as well.
  report_decode(1ull << 40);
  for (int i = 0; i < 200; ++i) {
    for (uint32_t g = 0; g < 2; ++g)
      for (auto& a : fetch(g).items)
        got.push_back(a);
    {
      std::lock_guard<std::mutex> guard{pushed->mtx};
      if (got.size() + pushed->items.size() >= 8)
        break;
    }
    report_decode(1ull << 40);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> guard{pushed->mtx};
    for (auto& a : pushed->items)
      got.push_back(a);
  }
  REQUIRE_EQ(got.size(), 8u);
  std::set<uint64_t> ids;
  for (auto& a : got) {
    CHECK(ids.insert(a.request.id).second); // never assigned twice
    CHECK(a.prefill_actor);
    CHECK(a.decode_actor);
    CHECK_EQ(a.decode.node, "de0");
    CHECK_EQ(a.plan.hit_blocks, 0u); // no store: nothing hits
  }
  // Completing every request answers every submitter exactly once; an
  // unknown or repeated completion is ignored.
  for (auto& a : got) {
    request_result r;
    r.id = a.request.id;
    self->send(sched, done_atom_v, r);
  }
  request_result dup;
  dup.id = got.front().request.id;
  self->send(sched, done_atom_v, dup);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> guard{*results_mtx};
      if (results->size() >= 8)
        break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> guard{*results_mtx};
  CHECK_EQ(results->size(), 8u);
  for (uint64_t i = 1; i <= 8; ++i)
    CHECK_EQ(results->count(i), 1u);
  self->send_exit(client, caf::exit_reason::user_shutdown);
}

TEST_CASE("an agent's hits equal a full lookup turn after turn") {
  // The scheduler probes only past the hit prefix an agent's last prompt
  // had; that must never change what hits: longer prompts, blocks stored
  // meanwhile, and a prompt of the same agent that diverges inside the
  // known prefix.
  using namespace transport::storage;
  kv_geometry geo{2, 64, 16};
  auto opened = block_store::open(store_config{"sim-store", "m", geo},
                                  make_modeled_backend());
  REQUIRE(opened);
  std::shared_ptr<block_store> store{std::move(*opened)};
  fixture f{store};
  auto ids = [](uint32_t seed, size_t n) {
    std::vector<uint32_t> t;
    for (size_t i = 0; i < n; ++i)
      t.push_back(seed * 100000 + static_cast<uint32_t>(i));
    return t;
  };
  auto p1 = ids(1, 5 * 64 + 10);
  REQUIRE(populate(*store, {p1}));
  auto spec = [](uint64_t id, std::vector<uint32_t> t) {
    request_spec r;
    r.id = id;
    r.agent = 7;
    r.tokens = std::move(t);
    r.gen_tokens = 1;
    return r;
  };
  auto expect = [&](const std::vector<uint32_t>& t) {
    return static_cast<uint32_t>(store->lookup(t).blocks.size());
  };
  CHECK_EQ(f.place(spec(1, p1)).plan.hit_blocks, 5u);
  // The next turn extends the prompt; its first 3 new blocks were stored
  // (persisted) meanwhile, the 4th not.
  auto p2 = p1;
  auto more = ids(2, 4 * 64 - 10);
  p2.insert(p2.end(), more.begin(), more.end());
  auto h2 = block_hashes(p2, 64);
  REQUIRE_EQ(h2.size(), 9u);
  for (size_t k = 5; k < 8; ++k)
    REQUIRE_FALSE(store->write_generated(h2[k], h2[k - 1]));
  REQUIRE_EQ(expect(p2), 8u);
  CHECK_EQ(f.place(spec(2, p2)).plan.hit_blocks, 8u);
  // Same agent, a prompt that shares only block 0 with the known prefix.
  auto q = p2;
  q[64 + 3] = 999999;
  REQUIRE_EQ(expect(q), 1u);
  CHECK_EQ(f.place(spec(3, q)).plan.hit_blocks, 1u);
  // And back: the whole stored prefix again; then a prompt shorter than
  // the known prefix.
  CHECK_EQ(f.place(spec(4, p2)).plan.hit_blocks, 8u);
  std::vector<uint32_t> shorter(p2.begin(), p2.begin() + 3 * 64 + 5);
  CHECK_EQ(f.place(spec(5, shorter)).plan.hit_blocks, 3u);
}

TEST_CASE_FIXTURE(fixture, "a duplicate request id is refused") {
  self->request(sched, timeout, submit_atom_v, make_request(5));
  bool refused = false;
  self->request(sched, timeout, submit_atom_v, make_request(5))
      .receive([](const request_result&) {},
               [&](caf::error& err) {
                 refused = true;
                 CHECK_NE(sys.render(err).find("duplicate request id 5"),
                          std::string::npos);
               });
  CHECK(refused);
}

TEST_CASE("an inconsistent cluster description is refused") {
  test::actor_config cfg{"sharing"};
  caf::actor_system sys{cfg};
  scheduler_config sc;
  CHECK_FALSE(spawn_scheduler(sys, sc)); // no engines at all
  sc.prefill.push_back(scheduled_engine{engine_id{"pe0"}, 0, 5});
  sc.decode.push_back(
      scheduled_engine{engine_id{"de0", engine_role::decode, 0}, 0, 0});
  sc.nodes.assign(1, scheduler::node_state{0, 1});
  auto res = spawn_scheduler(sys, sc); // node 5 does not exist
  REQUIRE_FALSE(res);
  CHECK_NE(sys.render(res.error()).find("scheduler cluster description"),
           std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "decode load counts dispatched requests reports "
                           "do not show yet") {
  // Decode engines report seq_e = tok_e = 0 between placements, as they do
  // while the requests still wait in prefill queues (a decode engine counts
  // a request from its admission on). The scheduler must still see what it
  // dispatched there: one request at a time, the two engines alternate
  // instead of the first one taking all.
  report_decode(1ull << 40);
  auto client = sys.spawn([](caf::event_based_actor*) {});
  std::map<uint32_t, int> per_engine;
  for (uint64_t id = 1; id <= 4; ++id) {
    caf::anon_send(sched, submit_atom_v, make_request(id));
    auto got = take_assigned();
    REQUIRE_EQ(got.size(), 1u);
    CHECK_EQ(got[0].request.id, id);
    ++per_engine[got[0].decode.rank];
    report_decode(1ull << 40); // "nothing admitted here"
  }
  CHECK_EQ(per_engine[0], 2);
  CHECK_EQ(per_engine[1], 2);
  self->send_exit(client, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "a decode engine's enrolled KV budget places "
                           "requests before its first report") {
  // The fixture's decode engines enrolled with no budget and never
  // reported: they count as full, and nothing is placed.
  caf::anon_send(sched, submit_atom_v, make_request(1));
  CHECK(take_assigned(20).empty());
  // One decode engine enrolls again (its node restarted) saying how much KV
  // it can take: the pending request goes there at once, still with no
  // report from any decode engine.
  enroll(des[1], engines[pes.size() + 1], 1ull << 40);
  auto placed = take_assigned();
  REQUIRE_EQ(placed.size(), 1u);
  CHECK_EQ(placed[0].request.id, 1u);
  CHECK_EQ(placed[0].decode.rank, 1u);
}

TEST_CASE_FIXTURE(fixture, "a failed attempt is re-queued; too many fail the "
                           "submitter with the engine's error") {
  // The submitter's outcome: a result or the error, exactly once.
  struct outcome {
    std::mutex mtx;
    std::vector<request_result> results;
    std::vector<caf::error> errors;
  };
  auto out = std::make_shared<outcome>();
  auto submit = [&](uint64_t id) {
    return sys.spawn([out, s = sched, id](caf::event_based_actor* c) {
      c->request(s, caf::infinite, submit_atom_v, make_request(id))
          .then(
              [out](request_result& r) {
                std::lock_guard<std::mutex> guard{out->mtx};
                out->results.push_back(std::move(r));
              },
              [out](caf::error& err) {
                std::lock_guard<std::mutex> guard{out->mtx};
                out->errors.push_back(std::move(err));
              });
    });
  };
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 400; ++i) {
      {
        std::lock_guard<std::mutex> guard{out->mtx};
        if (pred())
          return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  // Assigned attempts of a request, in the order the scheduler gave them.
  size_t seen = 0;
  auto next_attempt = [&](uint64_t id) {
    for (int i = 0; i < 400; ++i) {
      report_decode(1ull << 40);
      for (uint32_t g = 0; g < 2; ++g)
        for (auto& a : fetch(g).items)
          if ((a.request.id & ((uint64_t{1} << 48) - 1)) == id)
            return a;
      {
        std::lock_guard<std::mutex> guard{pushed->mtx};
        for (; seen < pushed->items.size(); ++seen)
          if ((pushed->items[seen].request.id & ((uint64_t{1} << 48) - 1))
              == id)
            return pushed->items[seen++];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL("request " << id << " was never assigned again");
    return assignment{};
  };
  auto fail = [&](const assignment& a) {
    self->send(
        sched, fail_atom_v,
        request_failure{a.request.id, a.prefill,
                        caf::make_error(transport::transport_errc::peer_lost,
                                        "layer send failed")});
  };
  auto c1 = submit(1);
  auto first = next_attempt(1);
  CHECK_EQ(first.request.id, 1u);
  fail(first);
  auto second = next_attempt(1);
  CHECK_EQ(second.request.id, 1u + (uint64_t{1} << 48)); // attempt 1
  // A late report of the first attempt changes nothing.
  fail(first);
  request_result r;
  r.id = second.request.id;
  self->send(sched, done_atom_v, r);
  REQUIRE(wait_for([&] { return !out->results.empty(); }));
  {
    std::lock_guard<std::mutex> guard{out->mtx};
    CHECK_EQ(out->results.size(), 1u);
    CHECK_EQ(out->results[0].id, 1u);
    CHECK_EQ(out->results[0].reroutes, 1u);
    CHECK(out->errors.empty());
  }
  // A request whose every attempt fails gets the last error, once.
  auto c2 = submit(2);
  for (uint32_t k = 0; k < max_attempts; ++k)
    fail(next_attempt(2));
  REQUIRE(wait_for([&] { return !out->errors.empty(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> guard{out->mtx};
  CHECK_EQ(out->errors.size(), 1u);
  CHECK(out->errors[0] == transport::transport_errc::peer_lost);
  CHECK_EQ(out->results.size(), 1u);
  self->send_exit(c1, caf::exit_reason::user_shutdown);
  self->send_exit(c2, caf::exit_reason::user_shutdown);
}
