// ctest-label: engines
// ctest-links: actors_cluster
// The prefill and decode engines end to end with real bytes on a tiny
// cluster: one prefill node and one decode node built as every deployment
// builds them (actors/cluster build_node: storage reader, the node's DRAM
// buffer registered with a local bulk backend on one fabric), a real block
// store on disk behind the fault-injecting backend, host GPU devices, and a
// stand-in for the scheduler that places what the test says. Every path
// leaves the decode node with the exact prompt KV (blocks_verified): the PE
// path, the DE path and a split, a request chunked across steps, the
// loopback H2D of gpu.h2d_via_transport; on the DE path only miss KV
// travels back; persisted blocks hold the expected bytes and are hits for
// the next turn; Oracle moves zero bytes; Basic reads only on the prefill
// side and holds every layer at once; a read error becomes recomputed
// misses; layerwise loads overlap compute where Basic's do not; a send that
// fails towards one decode node (a second one, "de1") fails only that
// node's requests, and a request that fails while a send of it is under way
// is reported to its decode node only once that send ended.
//
// Time: the readers and the bulk backends complete on their own I/O threads,
// so these tests run in real time, at a large time scale (1 real us = 1
// emulated ms) and with bounded waits, except the overlap test (time scale
// 1, 50 ms steps: scheduling noise only ever delays both sides).
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/cluster/cluster.hpp"
#include "actors/engines/engine_timing.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/observe/hooks.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "actors/protocol/register.hpp"
#include "actors/storage/storage_reader.hpp"
#include "tests/support/support.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/faulty_backend.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace std::chrono;
namespace storage = transport::storage;
namespace bulk = transport::bulk;

namespace {

constexpr uint32_t layers = 4;
constexpr uint32_t block_tokens = 4;
constexpr uint32_t bpt = 16; // bytes per token per layer (nominal = real)

caf::actor_system_config& with_types(caf::actor_system_config& cfg) {
  add_message_types(cfg);
  return cfg;
}

// What the engines sent to the scheduler, for the test thread.
struct inbox {
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<request_result> results;
  std::vector<request_failure> failures;
};

// Stands in for the global scheduler: engines enroll, fetch nothing, and
// report results and failures here. Placement is the test's.
scheduler_actor::behavior_type stand_in(scheduler_actor::pointer,
                                        std::shared_ptr<inbox> box) {
  return {
      [](submit_atom, request_spec&) -> caf::result<request_result> {
        return caf::make_error(caf::sec::unexpected_message, "no submits");
      },
      [](fetch_atom, const group_report&) { return work_batch{}; },
      [](report_atom, const group_report&) {},
      [](enroll_atom, const engine_registration&) { return true; },
      [box](done_atom, request_result& r) {
        std::lock_guard<std::mutex> guard{box->mtx};
        box->results.push_back(std::move(r));
        box->cv.notify_all();
      },
      [box](fail_atom, request_failure& f) {
        std::lock_guard<std::mutex> guard{box->mtx};
        box->failures.push_back(std::move(f));
        box->cv.notify_all();
      },
  };
}

// What else a rig may have: a second decode node "de1", and the prefill
// node's bulk transport behind the fault-injecting decorator.
struct rig_extras {
  bool second_decode = false;
  std::optional<bulk::fault_plan> pe_faults;
};

struct rig {
  test::temp_dir dir{"dp-engines"};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  storage::kv_geometry geo{layers, block_tokens, bpt};
  std::shared_ptr<storage::faulty_backend> faulty;
  std::shared_ptr<storage::block_store> store;
  std::shared_ptr<bulk::local_fabric> fabric = bulk::make_local_fabric();
  std::shared_ptr<inbox> box = std::make_shared<inbox>();
  scheduler_actor sched;
  emulated_time time;
  cluster::built_node pe;
  cluster::built_node de;
  caf::actor pe_engine;
  caf::actor de_engine;
  // A second decode node "de1" (rig_extras::second_decode).
  cluster::built_node de1;
  caf::actor de1_engine;

  using tweak_fn = std::function<void(cluster::cluster_spec&)>;

  explicit rig(load_mode mode, tweak_fn tweak = {}, double scale = 1000.0,
               rig_extras more = {})
      : time(steady_clock::now(), scale) {
    auto inner = storage::make_backend(
        storage::backend_config{storage::backend_kind::pread, 8});
    REQUIRE(inner);
    faulty = std::make_shared<storage::faulty_backend>(*inner);
    auto s = storage::block_store::open(
        storage::store_config{dir.path(), "engines-test", geo}, faulty);
    REQUIRE(s);
    store = std::move(*s);
    sched = sys.spawn(stand_in, box);
    auto spec = make_spec(mode);
    if (tweak)
      tweak(spec);
    if (more.second_decode)
      spec.decode_nodes = 2;
    pe = node(spec, "pe", engine_role::prefill, more.pe_faults);
    de = node(spec, "de", engine_role::decode);
    if (more.second_decode) {
      de1 = node(spec, "de1", engine_role::decode);
      auto h = cluster::spawn_node_engine(sys, spec, de1.node, 0, time, sched);
      REQUIRE(h);
      de1_engine = *h;
    }
    auto pe_hdl =
        cluster::spawn_node_engine(sys, spec, pe.node, 0, time, sched);
    REQUIRE(pe_hdl);
    pe_engine = *pe_hdl;
    auto de_hdl =
        cluster::spawn_node_engine(sys, spec, de.node, 0, time, sched);
    REQUIRE(de_hdl);
    de_engine = *de_hdl;
  }

  ~rig() {
    caf::scoped_actor self{sys};
    for (auto& hdl : {pe_engine, de_engine, de1_engine,
                      caf::actor_cast<caf::actor>(pe.node->reader),
                      caf::actor_cast<caf::actor>(de.node->reader),
                      de1.node ? caf::actor_cast<caf::actor>(de1.node->reader)
                               : caf::actor{},
                      caf::actor_cast<caf::actor>(sched)}) {
      if (!hdl)
        continue;
      self->monitor(hdl);
      self->send_exit(hdl, caf::exit_reason::user_shutdown);
      self->receive([](const caf::down_msg&) {});
    }
  }

  cluster::cluster_spec make_spec(load_mode mode) {
    cluster::cluster_spec s;
    s.prefill_nodes = 1;
    s.decode_nodes = 1;
    s.gpus_per_node = 1;
    s.snic_bytes_per_s = 50'000'000'000;
    s.cnic_bytes_per_s = 50'000'000'000;
    s.dram_bytes_per_s = 500'000'000'000;
    s.model.name = "engines-test";
    s.model.layers = layers;
    s.model.active_params = 1e9;
    s.model.attention_heads = 8;
    s.model.qk_head_dim = 64;
    s.model.v_head_dim = 64;
    s.model.kv_bytes_per_token_layer = bpt;
    s.gpu = gpu::gpu_rate{"test", 100.0, 1.0, 1.0, 1.0, 0};
    s.total_params = 1e6;
    s.hbm_bytes = 1 << 20;
    s.activation_reserve_bytes = 0;
    // 64 Full Blocks of 4 layers x 4 tokens x 16 B.
    s.dram_buffer_bytes = 64 * layers * block_tokens * bpt;
    s.max_prompt_tokens = 48;
    s.block_tokens = block_tokens;
    s.byte_scale = 1;
    s.time_scale = time.scale();
    s.mode = mode;
    s.policy.kind = mode == load_mode::basic || mode == load_mode::layerwise
                        ? scheduler::policy_kind::basic
                        : scheduler::policy_kind::dualpath;
    s.quota_s = 1.0;
    s.layer_window = 2;
    s.fetch_period_ns = 1'000'000'000;
    s.reader_io_threads = 2;
    s.plane = cluster::data_plane::real;
    return s;
  }

  cluster::built_node node(const cluster::cluster_spec& spec,
                           const std::string& name, engine_role role,
                           std::optional<bulk::fault_plan> faults = {}) {
    bulk::options opts;
    opts.backend = "local";
    opts.node = name;
    auto b = bulk::make_local_backend(opts, fabric);
    REQUIRE(b);
    std::unique_ptr<bulk::backend> transport = std::move(*b);
    if (faults)
      transport = bulk::make_fault_backend(std::move(transport), *faults);
    auto built = cluster::build_node(
        sys, spec, name, role,
        std::shared_ptr<bulk::backend>(std::move(transport)), store, time);
    REQUIRE_MESSAGE(built, (built ? "" : sys.render(built.error())));
    return std::move(*built);
  }

  // A prompt of `blocks` full blocks plus `tail` tokens, distinct per seed.
  static std::vector<uint32_t> prompt(uint32_t seed, uint32_t blocks,
                                      uint32_t tail) {
    std::vector<uint32_t> t;
    for (uint32_t i = 0; i < blocks * block_tokens + tail; ++i)
      t.push_back(seed * 100000 + i);
    return t;
  }

  // Stores the first `blocks` full blocks of `tokens`.
  void populate(const std::vector<uint32_t>& tokens, uint32_t blocks) {
    std::vector<uint32_t> prefix(tokens.begin(),
                                 tokens.begin() + blocks * block_tokens);
    REQUIRE(storage::populate(*store, {prefix}));
  }

  assignment make(request_spec r, read_plan plan) {
    assignment a;
    a.request = std::move(r);
    a.prefill = engine_id{"pe", engine_role::prefill, 0};
    a.decode = engine_id{"de", engine_role::decode, 0};
    a.plan = plan;
    a.prefill_actor = pe_engine;
    a.decode_actor = de_engine;
    return a;
  }

  // Places `batch` as the scheduler does and waits for every result.
  std::vector<request_result> run(std::vector<assignment> batch) {
    auto want = batch.size();
    {
      std::lock_guard<std::mutex> guard{box->mtx};
      box->results.clear();
    }
    for (auto& a : batch)
      caf::anon_send(caf::actor_cast<decode_engine_actor>(de_engine),
                     assign_atom_v, a);
    caf::anon_send(caf::actor_cast<prefill_engine_actor>(pe_engine),
                   prefill_atom_v, work_batch{std::move(batch)});
    std::unique_lock<std::mutex> lock{box->mtx};
    box->cv.wait_for(lock, seconds(20), [&] {
      return box->results.size() >= want || !box->failures.empty();
    });
    CHECK(box->failures.empty());
    CHECK_EQ(box->results.size(), want);
    return box->results;
  }
};

request_spec spec(uint64_t id, std::vector<uint32_t> tokens, uint32_t gen,
                  std::vector<uint32_t> out) {
  request_spec r;
  r.id = id;
  r.tokens = std::move(tokens);
  r.gen_tokens = gen;
  r.output_tokens = std::move(out);
  return r;
}

uint64_t kv_bytes(uint64_t tokens) {
  return tokens * layers * bpt;
}

// True if block `hash` is stored with exactly the deterministic content.
bool stored_exact(storage::block_store& store, block_hash hash) {
  auto& geo = store.geometry();
  auto file = storage::aligned_buffer::make(geo.file_bytes());
  REQUIRE(file);
  if (!store.read_full(hash, file->data()))
    return false;
  for (uint32_t l = 0; l < geo.layers; ++l)
    if (!storage::kv_check_layer(hash, l, geo.block_tokens,
                                 geo.bytes_per_token_layer,
                                 file->data() + geo.layer_offset(l)))
      return false;
  return true;
}

} // namespace

TEST_CASE("both read paths and a split leave the exact prompt KV at the DE") {
  struct variant {
    const char* name;
    uint32_t pe_side;
  };
  for (auto v :
       {variant{"PE path", 3}, variant{"DE path", 0}, variant{"split", 1}}) {
    CAPTURE(v.name);
    rig c{load_mode::dualpath};
    // 3 stored blocks, 1 missing full block and a 2-token partial block.
    auto tokens = rig::prompt(1, 4, 2);
    c.populate(tokens, 3);
    REQUIRE_EQ(c.store->lookup(tokens).blocks.size(), 3u);
    auto res = c.run(
        {c.make(spec(1, tokens, 4, {7, 8, 9, 10}), read_plan{3, v.pe_side})});
    REQUIRE_EQ(res.size(), 1u);
    auto& r = res[0];
    CHECK_EQ(r.id, 1u);
    CHECK_EQ(r.verify_failures, 0u);
    CHECK_EQ(r.blocks_verified, 5u); // 4 full blocks + the partial one
    CHECK_EQ(r.recomputed_blocks, 0u);
    uint32_t de_side = 3 - v.pe_side;
    CHECK_EQ(r.bytes_read_pe, kv_bytes(v.pe_side * block_tokens));
    CHECK_EQ(r.bytes_read_de, kv_bytes(de_side * block_tokens));
    // Only PE-side hits and misses travel PE -> DE; DE-side hits go to the
    // PE GPU once per layer and never come back.
    CHECK_EQ(r.bytes_pe_to_de,
             kv_bytes(tokens.size() - de_side * block_tokens));
    CHECK_EQ(r.bytes_de_to_pe, kv_bytes(de_side * block_tokens));
    CHECK_EQ(r.bytes_compute_net, r.bytes_pe_to_de + r.bytes_de_to_pe);
    CHECK_GT(r.ttft_ns, 0);
    CHECK_GT(r.tpot_ns, 0);
    CHECK_GE(r.ttst_ns, r.ttft_ns);
    CHECK_GE(r.done_ns, r.ttst_ns);
  }
}

TEST_CASE("a send that fails towards one decode node fails only that node's "
          "requests; the other node's KV is exact") {
  // Posts from the prefill node to de1 fail (peer_lost, as when de1's
  // process dies), their completions later, as over a network. Requests
  // alternate between de and de1: the first admitted runs alone, the others
  // share the step packed after it, whose sends to de1 fail while those to
  // de are under way.
  bulk::fault_plan plan;
  plan.drop_peer = "de1";
  plan.delay = milliseconds(20);
  rig c{load_mode::dualpath, {}, 1000.0, rig_extras{true, plan}};
  constexpr uint64_t n = 6;
  std::vector<assignment> batch;
  for (uint64_t id = 1; id <= n; ++id) {
    auto tokens = rig::prompt(static_cast<uint32_t>(id), 3, 2);
    c.populate(tokens, 2);
    auto a = c.make(spec(id, tokens, 4, {7, 8, 9, 10}), read_plan{2, 2});
    if (id % 2 == 0) {
      a.decode = engine_id{"de1", engine_role::decode, 0};
      a.decode_actor = c.de1_engine;
    }
    caf::anon_send(caf::actor_cast<decode_engine_actor>(a.decode_actor),
                   assign_atom_v, a);
    batch.push_back(std::move(a));
  }
  caf::anon_send(caf::actor_cast<prefill_engine_actor>(c.pe_engine),
                 prefill_atom_v, work_batch{std::move(batch)});
  std::unique_lock<std::mutex> lock{c.box->mtx};
  auto& box = *c.box;
  auto failed = [&] {
    std::set<uint64_t> ids;
    for (auto& f : box.failures)
      ids.insert(f.id);
    return ids;
  };
  box.cv.wait_for(lock, seconds(20),
                  [&] { return box.results.size() + failed().size() >= n; });
  // Whatever else would fail has had its time.
  box.cv.wait_for(lock, milliseconds(300), [] { return false; });
  // Every request of de completed with its exact KV; every one of de1
  // failed, and only for its node.
  CHECK_EQ(box.results.size(), n / 2);
  for (auto& r : box.results) {
    CAPTURE(r.id);
    CHECK_EQ(r.id % 2, 1u);
    CHECK_EQ(r.verify_failures, 0u);
    CHECK_EQ(r.blocks_verified, 4u); // 3 full blocks + the partial one
  }
  CHECK_EQ(failed().size(), n / 2);
  for (auto& f : box.failures) {
    CAPTURE(f.id);
    CHECK_EQ(f.id % 2, 0u);
    CHECK_EQ(static_cast<transport::transport_errc>(f.error.code()),
             transport::transport_errc::peer_lost);
  }
}

TEST_CASE("a request that fails while a send of it is under way is reported "
          "(and its decode slot released) only once that send ended") {
  // Layer 0's send to de passes but completes 300 ms later, as over a slow
  // network; layer 1's fails at once. Until layer 0's bytes have landed, de
  // must not hear of the failure: it would give the request's buffer slots
  // to another request, into which they would then land.
  bulk::fault_plan plan;
  plan.fail_after = 1;
  plan.delay = milliseconds(300);
  plan.fail_at_once = true;
  rig c{load_mode::dualpath, {}, 1000.0, rig_extras{false, plan}};
  auto tokens = rig::prompt(1, 3, 2);
  c.populate(tokens, 2);
  auto a = c.make(spec(1, tokens, 4, {7, 8, 9, 10}), read_plan{2, 2});
  caf::anon_send(caf::actor_cast<decode_engine_actor>(c.de_engine),
                 assign_atom_v, a);
  auto start = steady_clock::now();
  caf::anon_send(caf::actor_cast<prefill_engine_actor>(c.pe_engine),
                 prefill_atom_v, work_batch{{a}});
  std::unique_lock<std::mutex> lock{c.box->mtx};
  REQUIRE(c.box->cv.wait_for(lock, seconds(20),
                             [&] { return !c.box->failures.empty(); }));
  auto took = steady_clock::now() - start;
  auto& f = c.box->failures.front();
  CHECK_EQ(f.id, 1u);
  CHECK_EQ(static_cast<transport::transport_errc>(f.error.code()),
           transport::transport_errc::injected_fault);
  CHECK(took >= milliseconds(300));
  CHECK(c.box->results.empty());
}

TEST_CASE("a request chunked across steps is byte-exact at the DE") {
  // A compute quota far below one request's attention: the prefill engine
  // cuts it into chunks of at least one block (min_chunk), each chunk
  // attending to the KV of the chunks before it (pushed back from the
  // decode node's buffer where it landed).
  auto tiny_quota = [](cluster::cluster_spec& s) { s.quota_s = 1e-12; };
  for (uint32_t pe_side : {3u, 0u}) {
    CAPTURE(pe_side);
    rig c{load_mode::dualpath, tiny_quota};
    auto tokens = rig::prompt(9, 6, 3); // 3 hits, 3 missing blocks + 3
    c.populate(tokens, 3);
    auto res =
        c.run({c.make(spec(1, tokens, 2, {11, 12}), read_plan{3, pe_side})});
    REQUIRE_EQ(res.size(), 1u);
    CHECK_EQ(res[0].verify_failures, 0u);
    CHECK_EQ(res[0].blocks_verified, 7u);
    // 15 new tokens in chunks of one block: 4 steps.
    CHECK_EQ(res[0].bytes_pe_to_de,
             kv_bytes(tokens.size() - (3 - pe_side) * block_tokens));
  }
}

TEST_CASE("completed blocks are persisted byte-exact and hit the next turn") {
  rig c{load_mode::dualpath};
  auto tokens = rig::prompt(4, 3, 2); // 3 full blocks + 2 tokens
  c.populate(tokens, 2);
  // 5 output tokens: the partial block completes (2 + 2), one token is left
  // over as the new trailing partial block.
  std::vector<uint32_t> out{901, 902, 903, 904, 905};
  auto res = c.run({c.make(spec(1, tokens, 5, out), read_plan{2, 1})});
  REQUIRE_EQ(res.size(), 1u);
  auto& r = res[0];
  CHECK_EQ(r.verify_failures, 0u);
  // Block 2 (a prompt miss) and block 3 (prompt tail + 2 outputs).
  CHECK_EQ(r.blocks_persisted, 2u);
  auto next_turn = tokens;
  next_turn.insert(next_turn.end(), out.begin(), out.end());
  auto full = storage::block_hashes(next_turn, block_tokens);
  REQUIRE_EQ(full.size(), 4u);
  CHECK_EQ(c.store->lookup(next_turn).blocks.size(), 4u);
  for (auto h : full)
    CHECK(stored_exact(*c.store, h));
  // The trailing partial block (token 905) is not persisted.
  auto hashes = prompt_block_hashes(next_turn, block_tokens);
  REQUIRE_EQ(hashes.size(), 5u);
  CHECK_FALSE(c.store->contains(hashes.back()));
  // The next turn reads every block back and completes byte-exact.
  next_turn.push_back(906);
  auto res2 = c.run({c.make(spec(2, next_turn, 1, {}), read_plan{4, 2})});
  REQUIRE_EQ(res2.size(), 1u);
  CHECK_EQ(res2[0].verify_failures, 0u);
  CHECK_EQ(res2[0].blocks_verified, 5u);
  // PE-side hits (blocks 0, 1) and the 4 miss tokens of block 4.
  CHECK_EQ(res2[0].bytes_pe_to_de, kv_bytes(2 * block_tokens + 4));
}

TEST_CASE("Oracle moves zero bytes and still leaves the exact KV") {
  rig c{load_mode::oracle};
  auto tokens = rig::prompt(5, 3, 3);
  c.populate(tokens, 3);
  auto res = c.run({c.make(spec(1, tokens, 3, {1, 2, 3}), read_plan{3, 1})});
  REQUIRE_EQ(res.size(), 1u);
  auto& r = res[0];
  CHECK_EQ(r.verify_failures, 0u);
  CHECK_EQ(r.blocks_verified, 4u);
  CHECK_EQ(r.bytes_read_pe, 0u);
  CHECK_EQ(r.bytes_read_de, 0u);
  CHECK_EQ(r.bytes_compute_net, 0u);
  // I/O is bypassed, caching is not: the block completed by the decoded
  // tokens (15 prompt + 3 output = 4 full blocks) is stored at once, with
  // the exact content, so the next turn hits it as in every other mode.
  CHECK_EQ(r.blocks_persisted, 1u);
  auto seq = tokens;
  seq.insert(seq.end(), {1, 2, 3});
  auto hashes = storage::block_hashes(seq, block_tokens);
  REQUIRE_EQ(hashes.size(), 4u);
  CHECK(stored_exact(*c.store, hashes[3]));
  CHECK_EQ(c.pe.node->bulk->stats().bytes_sent[1], 0u);
  CHECK_EQ(c.de.node->bulk->stats().bytes_sent[1], 0u);
  CHECK_GT(r.ttft_ns, 0); // compute time only
}

TEST_CASE("Basic reads only on the prefill side and holds every layer") {
  rig c{load_mode::basic};
  auto tokens = rig::prompt(6, 3, 1);
  c.populate(tokens, 3);
  auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{3, 0})});
  REQUIRE_EQ(res.size(), 1u);
  auto& r = res[0];
  CHECK_EQ(r.verify_failures, 0u);
  CHECK_EQ(r.bytes_read_de, 0u);
  CHECK_EQ(r.bytes_read_pe, kv_bytes(3 * block_tokens));
  CHECK_EQ(r.bytes_de_to_pe, 0u);
  CHECK_EQ(r.bytes_pe_to_de, kv_bytes(tokens.size()));
}

TEST_CASE("an engine that cannot set itself up is not enrolled; the error "
          "says why") {
  rig c{load_mode::dualpath};
  // A decode node without its storage reader: the engine stops in its
  // set-up instead of running.
  auto broken = std::make_shared<node_resources>(*c.de.node);
  broken->reader = storage_reader_actor{};
  auto hdl = cluster::spawn_node_engine(c.sys, c.make_spec(load_mode::dualpath),
                                        broken, 0, c.time, c.sched);
  REQUIRE_FALSE(hdl);
  auto msg = c.sys.render(hdl.error());
  CAPTURE(msg);
  CHECK(msg.find("decode engine of node de did not start")
        != std::string::npos);
  CHECK(msg.find("buffer pool and reader") != std::string::npos);
  // The healthy engines of the rig answered the same probe and run on.
  auto tokens = rig::prompt(9, 2, 1);
  c.populate(tokens, 2);
  auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{2, 1})});
  REQUIRE_EQ(res.size(), 1u);
  CHECK_EQ(res[0].verify_failures, 0u);
}

TEST_CASE("a storage read error becomes recomputed misses, still byte-exact") {
  for (uint32_t pe_side : {3u, 0u}) {
    CAPTURE(pe_side);
    rig c{load_mode::dualpath};
    auto tokens = rig::prompt(7, 4, 1);
    c.populate(tokens, 3);
    auto hashes = storage::block_hashes(tokens, block_tokens);
    // Block 1's file fails every read: blocks 1 and 2 are recomputed.
    storage::fault_plan plan;
    plan.path_filter = c.store->path_of(hashes[1]);
    plan.fail_after = 0;
    c.faulty->set_plan(plan);
    auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{3, pe_side})});
    REQUIRE_EQ(res.size(), 1u);
    auto& r = res[0];
    CHECK_EQ(r.recomputed_blocks, 2u);
    CHECK_EQ(r.verify_failures, 0u);
    CHECK_EQ(r.blocks_verified, 5u);
    // Everything but block 0 is computed and travels PE -> DE.
    uint64_t de_hit = pe_side == 0 ? block_tokens : 0;
    CHECK_EQ(r.bytes_pe_to_de, kv_bytes(tokens.size() - de_hit));
  }
}

TEST_CASE("h2d_via_transport: PE-side hits reach the GPU as bulk writes") {
  // The CNIC-centric H2D of brief 2.3: the copies from the node's buffer
  // into the GPU go through the bulk transport (kv class) instead of a
  // local copy; the KV is just as exact and the transport counts them.
  for (bool via : {false, true}) {
    CAPTURE(via);
    rig c{load_mode::dualpath,
          [via](cluster::cluster_spec& s) { s.h2d_via_transport = via; }};
    auto tokens = rig::prompt(10, 4, 2);
    c.populate(tokens, 3);
    auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{3, 3})});
    REQUIRE_EQ(res.size(), 1u);
    CHECK_EQ(res[0].verify_failures, 0u);
    CHECK_EQ(res[0].blocks_verified, 5u);
    // Sent by the prefill node: the layers to the decode node, and with the
    // loopback H2D every PE-side Layer Block once more.
    auto sent = c.pe.node->bulk->stats().bytes_sent[1];
    auto to_de = kv_bytes(tokens.size());
    CHECK_EQ(sent, via ? to_de + kv_bytes(3 * block_tokens) : to_de);
  }
}

// The spans an engine reports through its observation hooks, for the test
// thread: the same records a timeline is made of.
class span_log : public observe::hooks {
public:
  // The cluster's emulated time, once the rig has made it (before any
  // request runs).
  void bind(const emulated_time& time) {
    std::lock_guard<std::mutex> guard{mtx_};
    time_ = time;
  }
  int64_t at(time_point actor_now) const override {
    std::lock_guard<std::mutex> guard{mtx_};
    return time_.since_start_ns(actor_now);
  }
  bool tracing() const override {
    return true;
  }
  void span(observe::span_record x) override {
    std::lock_guard<std::mutex> guard{mtx_};
    spans_.push_back(std::move(x));
  }
  void describe(const std::string&, observe::metric_kind,
                const std::string&) override {
  }
  void count(const std::string&, const observe::label_set&, double) override {
  }
  void gauge(const std::string&, const observe::label_set&, double) override {
  }
  void observe(const std::string&, const observe::label_set&, double) override {
  }
  void event(const std::string&, const std::string&, uint64_t, int64_t,
             const std::string&) override {
  }
  // The prefill node's span `name` of `layer` (REQUIREd to be there once).
  observe::span_record find(const std::string& name, int32_t layer) const {
    std::lock_guard<std::mutex> guard{mtx_};
    std::vector<observe::span_record> hits;
    for (auto& x : spans_)
      if (x.node == "pe" && x.name == name && x.layer == layer)
        hits.push_back(x);
    REQUIRE_MESSAGE(hits.size() == 1, name << " of layer " << layer);
    return hits[0];
  }

private:
  emulated_time time_;
  mutable std::mutex mtx_;
  std::vector<observe::span_record> spans_;
};

TEST_CASE("layerwise loads overlap compute; Basic loads everything first") {
  // Every layer's PE-side hits take 50 ms on the PE's CNIC (receive side),
  // every layer computes in 50 ms. Layerwise (window 2): the first load, then
  // the loads hide behind compute: about 5 x 50 ms. Basic: 4 loads, then 4
  // computes: about 8 x 50 ms.
  //
  // What the engines do is checked on their spans, which hold whatever the
  // machine's load: layerwise loads layer 2 only once layer 0 is computed
  // (the window) and so computes while it loads; Basic computes only once
  // every layer is loaded. The TTFTs are real time (time scale 1): noise only
  // ever adds to them, so each is at least its ideal, and layerwise must beat
  // Basic by 1.5 steps in at least one of a few tries (a loaded machine, a
  // sanitizer, can delay any single try by more than that).
  const auto step = milliseconds(50);
  auto tokens = rig::prompt(8, 3, 2); // 12 hit tokens, 2 miss tokens
  const uint64_t hit_bytes_per_layer = 12 * bpt;
  struct run_result {
    nanoseconds ttft;
    std::shared_ptr<span_log> spans;
  };
  auto ttft = [&](load_mode m) {
    auto log = std::make_shared<span_log>();
    auto tweak = [&](cluster::cluster_spec& s) {
      // One layer of this request takes `step` on the GPU: the toy model's
      // FLOPs over a rate chosen for it (no overhead, flat efficiency).
      auto m = s.model;
      double flops = gpu::prefill_flops_per_layer(m, {{12, 2}});
      s.gpu.tflops = flops / duration<double>(step).count() / 1e12;
      s.cnic_bytes_per_s = hit_bytes_per_layer * 1000 / step.count();
      s.hooks = log;
    };
    rig c{m, tweak, 1.0};
    log->bind(c.time);
    c.populate(tokens, 3);
    auto r = spec(1, tokens, 1, {});
    r.arrival_ns = c.time.since_start_ns(steady_clock::now());
    auto res = c.run({c.make(std::move(r), read_plan{3, 3})});
    REQUIRE_EQ(res.size(), 1u);
    CHECK_EQ(res[0].verify_failures, 0u);
    return run_result{nanoseconds(res[0].ttft_ns), log};
  };
  bool faster = false;
  for (int attempt = 0; attempt < 5 && !faster; ++attempt) {
    CAPTURE(attempt);
    auto layerwise = ttft(load_mode::layerwise);
    auto basic = ttft(load_mode::basic);
    MESSAGE("TTFT layerwise " << layerwise.ttft.count() / 1e6 << " ms, basic "
                              << basic.ttft.count() / 1e6 << " ms");
    CHECK_GE(layerwise.ttft, 5 * step);
    CHECK_GE(basic.ttft, 8 * step);
    // Layerwise: layer 2's load starts once layer 0 is computed (and sent),
    // and layer 0 computes before the last layer's load ends.
    auto& lw = *layerwise.spans;
    CHECK_GE(lw.find("h2d", 2).begin_ns, lw.find("compute", 0).end_ns);
    CHECK_LT(lw.find("compute", 0).begin_ns, lw.find("h2d", layers - 1).end_ns);
    // Basic: no layer computes before every load has ended.
    auto& b = *basic.spans;
    for (uint32_t l = 0; l < layers; ++l)
      CHECK_GE(b.find("compute", 0).begin_ns,
               b.find("h2d", static_cast<int32_t>(l)).end_ns);
    faster = layerwise.ttft < basic.ttft - 3 * step / 2;
  }
  CHECK_MESSAGE(faster, "layerwise was never 1.5 steps faster than Basic");
}

TEST_CASE("the decode GPU's check finds each wrong Layer Block, and such KV "
          "is never persisted") {
  // The test plays the prefill engine: it asks the decode engine for room,
  // writes the prompt's KV into the slots itself, with one byte flipped
  // where the case says, and sends the summary and every layer. The decode
  // node checksums what reached its GPU (host device: same checksums,
  // computed on its stream); a flip in the partial tail block past its 3
  // tokens is padding, not KV.
  struct flip {
    const char* name;
    int block; // -1: no flip
    uint32_t layer;
    uint32_t token;
    bool wrong;
  };
  rig c{load_mode::dualpath};
  auto tokens = rig::prompt(21, 2, 3);
  auto hashes = prompt_block_hashes(tokens, block_tokens);
  REQUIRE_EQ(hashes.size(), 3u);
  auto de = caf::actor_cast<decode_engine_actor>(c.de_engine);
  uint64_t id = 100;
  for (auto f :
       {flip{"none", -1, 0, 0, false}, flip{"full block", 1, 2, 1, true},
        flip{"tail token", 2, 3, 2, true},
        flip{"tail padding", 2, 0, 3, false}}) {
    CAPTURE(f.name);
    auto a = c.make(spec(++id, tokens, 1, {}), read_plan{0, 0});
    caf::anon_send(de, assign_atom_v, a);
    caf::scoped_actor self{c.sys};
    decode_slot slot;
    self->request(de, seconds(10), admit_atom_v, a)
        .receive([&](decode_slot& s) { slot = std::move(s); },
                 [&](caf::error& err) { FAIL(c.sys.render(err)); });
    REQUIRE_EQ(slot.blocks.size(), 3u);
    for (uint32_t k = 0; k < 3; ++k) {
      auto& region = slot.blocks[k];
      REQUIRE_EQ(region.length, uint64_t{layers} * block_tokens * bpt);
      auto* p = reinterpret_cast<std::byte*>(region.base) + region.offset;
      fill_block(hashes, k, block_tokens, layers,
                 static_cast<uint32_t>(tokens.size()), bpt, p);
      if (f.block == static_cast<int>(k))
        p[block_offset(f.layer, f.token, block_tokens, bpt)] ^= std::byte{0x5a};
    }
    {
      std::lock_guard<std::mutex> guard{c.box->mtx};
      c.box->results.clear();
    }
    auto n = static_cast<uint32_t>(tokens.size());
    caf::anon_send(de, prefilled_atom_v, prefill_summary{id, 0, 0, 0, 0});
    for (uint32_t l = 0; l < layers; ++l)
      caf::anon_send(de, layer_atom_v,
                     layer_batch{l, 0, {layer_chunk{id, 0, n, 0, {}}}});
    std::unique_lock<std::mutex> lock{c.box->mtx};
    c.box->cv.wait_for(lock, seconds(20),
                       [&] { return !c.box->results.empty(); });
    REQUIRE_EQ(c.box->results.size(), 1u);
    auto& r = c.box->results[0];
    CHECK_EQ(r.verify_failures, f.wrong ? 1u : 0u);
    CHECK_EQ(r.blocks_verified, f.wrong ? 2u : 3u);
    // Clean KV persists its 2 full blocks; wrong KV persists nothing.
    CHECK_EQ(r.blocks_persisted, f.wrong ? 0u : 2u);
  }
}
