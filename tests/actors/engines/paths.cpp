// ctest-label: engines
// ctest-links: actors_storage
// The prefill engine, layer streamer and decode engine end to end on a tiny
// cluster built by hand: one prefill node and one decode node with local bulk
// backends on one fabric, a real block store on disk pre-populated with
// populate() (behind the fault-injecting storage backend), real storage
// readers, host GPU devices. Every acceptance point of the engines: both read
// paths and a split leave the decode engine with the exact prompt KV; on the
// DE path only miss KV travels back; GPU residency never exceeds the layer
// window; persisted blocks hold the expected bytes and are hits for the next
// turn, a trailing partial block is not persisted; Oracle moves zero bytes;
// Basic never reads on the decode side; a storage read error turns into
// recomputed misses and the request still completes byte-exact.
//
// Time: the readers and the bulk backends complete on their own I/O threads,
// so these tests run in real time with a large time scale (1 real us = 1
// emulated ms) and bounded waits (10 s per request), not under the test
// coordinator (tests/actors/engines/prefill_engine.cpp checks exact timing
// there). The overlap test runs at time scale 1 with 50 ms steps, so scheduling
// noise (which only ever delays) stays far below the margins it checks.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <functional>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/engines/decode_engine.hpp"
#include "actors/engines/engine_timing.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/engines/prefill_engine.hpp"
#include "actors/protocol/register.hpp"
#include "actors/storage/storage_reader.hpp"
#include "gpu/device.hpp"
#include "tests/support/support.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
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

struct node_parts {
  node_ptr node;
  std::shared_ptr<storage::buffer_pool> pool;
  bulk::local_registration pool_reg;
  std::shared_ptr<storage_reader_counters> counters;
  std::shared_ptr<gpu::device> device;
};

struct cluster {
  test::temp_dir dir{"dp-engines"};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  storage::kv_geometry geo{layers, block_tokens, bpt};
  std::shared_ptr<storage::faulty_backend> faulty;
  std::shared_ptr<storage::block_store> store;
  std::shared_ptr<bulk::local_fabric> fabric = bulk::make_local_fabric();
  emulated_time time;
  node_parts pe;
  node_parts de;
  prefill_engine_actor pe_actor;
  decode_engine_actor de_actor;
  caf::scoped_actor self{sys};
  load_mode mode;
  // Whether the readers pace their reads on the node's storage NIC.
  bool pace_storage = false;
  uint64_t snic_rate = 0;

  using tweak_fn = std::function<void(engine_config&)>;

  explicit cluster(load_mode m, uint32_t window = 2, tweak_fn tweak = {},
                   double scale = 1000.0, uint64_t snic_bytes_per_s = 0)
      : time(steady_clock::now(), scale),
        mode(m),
        pace_storage(snic_bytes_per_s > 0),
        snic_rate(snic_bytes_per_s) {
    auto inner = storage::make_backend(
        storage::backend_config{storage::backend_kind::pread, 8});
    REQUIRE(inner);
    faulty = std::make_shared<storage::faulty_backend>(*inner);
    auto s = storage::block_store::open(
        storage::store_config{dir.path(), "engines-test", geo}, faulty);
    REQUIRE(s);
    store = std::move(*s);
    pe = make_node("pe", engine_role::prefill);
    de = make_node("de", engine_role::decode);
    auto pe_cfg = engine(pe, window);
    auto de_cfg = engine(de, window);
    if (tweak) {
      tweak(pe_cfg);
      tweak(de_cfg);
    }
    pe_actor = spawn_prefill_engine(sys, pe_cfg);
    de_actor = spawn_decode_engine(sys, de_cfg);
  }

  ~cluster() {
    self->send_exit(pe_actor, caf::exit_reason::user_shutdown);
    self->send_exit(de_actor, caf::exit_reason::user_shutdown);
    self->send_exit(pe.node->reader, caf::exit_reason::user_shutdown);
    self->send_exit(de.node->reader, caf::exit_reason::user_shutdown);
  }

  node_parts make_node(const std::string& name, engine_role role) {
    node_parts p;
    p.node = std::make_shared<node_resources>();
    auto& n = *p.node;
    n.name = name;
    n.role = role;
    n.snic = std::make_shared<emulated_link>(
        name + ".snic", snic_rate > 0 ? snic_rate : 50'000'000'000);
    n.dram = std::make_shared<emulated_link>(name + ".dram", 500'000'000'000);
    n.cnic_rx.push_back(
        std::make_shared<emulated_link>(name + ".cnic_rx0", 50'000'000'000));
    n.cnic_tx.push_back(
        std::make_shared<emulated_link>(name + ".cnic_tx0", 50'000'000'000));
    bulk::options opts;
    opts.backend = "local";
    opts.node = name;
    auto b = bulk::make_local_backend(opts, fabric);
    REQUIRE(b);
    n.bulk = std::shared_ptr<bulk::backend>(std::move(*b));
    n.store = store;
    auto pool =
        storage::buffer_pool::make(16 * geo.file_bytes(), geo.file_bytes());
    REQUIRE(pool);
    p.pool = *pool;
    auto reg = n.bulk->register_region(p.pool->base(), p.pool->size());
    REQUIRE(reg);
    p.pool_reg = std::move(*reg);
    p.counters = std::make_shared<storage_reader_counters>();
    storage_reader_config rc;
    rc.node = name;
    rc.region_id = p.pool_reg.id();
    rc.region_key = p.pool_reg.describe().key;
    rc.store = store;
    rc.pool = p.pool;
    rc.counters = p.counters;
    if (pace_storage)
      rc.pace = [link = n.snic, t = time](uint64_t bytes,
                                          emulated_time::time_point now) {
        auto emu_now = t.to_emulated(now);
        auto done = link->reserve(bytes, emu_now);
        return now + t.to_actor(done - emu_now);
      };
    // Persist sources are this process's registered regions.
    rc.resolve = [](const remote_region& r) -> caf::expected<const std::byte*> {
      return reinterpret_cast<const std::byte*>(r.base) + r.offset;
    };
    auto reader = spawn_storage_reader(sys, rc);
    REQUIRE(reader);
    n.reader = *reader;
    gpu::device_options dopts;
    dopts.backend = gpu::backend_choice::host;
    dopts.hbm_budget = 1 << 20;
    auto dev = gpu::make_host_device(dopts);
    REQUIRE(dev);
    p.device = *dev;
    return p;
  }

  engine_config engine(const node_parts& p, uint32_t window) {
    engine_config c;
    c.id = engine_id{p.node->name, p.node->role, 0};
    c.mode = mode;
    c.layer_window = window;
    c.model.layers = layers;
    c.model.block_tokens = block_tokens;
    c.model.nominal_bytes_per_token_layer = bpt;
    c.model.real_bytes_per_token_layer = bpt;
    c.model.active_params = 1e9;
    c.model.attn_heads = 8;
    c.model.attn_qk_dim = 64;
    c.model.attn_v_dim = 64;
    c.time = time;
    c.byte_scale = 1;
    c.node = p.node;
    c.device = p.device;
    c.gpu_flops = 1e14;
    c.hbm_bytes = 1 << 20;
    c.dram_buffer_bytes = 1 << 20;
    c.scheduler = caf::actor_cast<caf::actor>(self);
    return c;
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
    a.prefill_actor = caf::actor_cast<caf::actor>(pe_actor);
    a.decode_actor = caf::actor_cast<caf::actor>(de_actor);
    return a;
  }

  // Prefills `batch` and waits for every request's result (bounded).
  std::vector<request_result> run(std::vector<assignment> batch,
                                  stream_report* report = nullptr) {
    std::vector<request_result> results;
    size_t want = batch.size();
    bool replied = false;
    self->request(pe_actor, seconds(10), prefill_atom_v,
                  work_batch{std::move(batch)})
        .receive(
            [&](stream_report& rep) {
              replied = true;
              if (report)
                *report = std::move(rep);
            },
            [&](caf::error& err) { FAIL(sys.render(err)); });
    CHECK(replied);
    while (results.size() < want) {
      bool got = false;
      self->receive(
          [&](done_atom, request_result& r) {
            got = true;
            results.push_back(std::move(r));
          },
          caf::after(seconds(10)) >> [] {});
      if (!got) {
        FAIL("no request_result within 10 s");
        break;
      }
    }
    return results;
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
    cluster c{load_mode::dualpath};
    // 3 stored blocks, 1 missing full block and a 2-token partial block.
    auto tokens = cluster::prompt(1, 4, 2);
    c.populate(tokens, 3);
    REQUIRE_EQ(c.store->lookup(tokens).blocks.size(), 3u);
    stream_report rep;
    auto res = c.run(
        {c.make(spec(1, tokens, 4, {7, 8, 9, 10}), read_plan{3, v.pe_side})},
        &rep);
    REQUIRE_EQ(res.size(), 1u);
    auto& r = res[0];
    CHECK_EQ(r.id, 1u);
    CHECK_EQ(r.verify_failures, 0u);
    CHECK_EQ(r.blocks_verified, 5u); // 4 full blocks + the partial one
    CHECK_EQ(r.recomputed_blocks, 0u);
    uint32_t de_side = 3 - v.pe_side;
    CHECK_EQ(r.bytes_read_pe, kv_bytes(v.pe_side * block_tokens));
    CHECK_EQ(r.bytes_read_de, kv_bytes(de_side * block_tokens));
    CHECK_EQ(c.pe.counters->blocks_read.load(), v.pe_side);
    CHECK_EQ(c.de.counters->blocks_read.load(), de_side);
    // Only PE-side hits and misses travel PE -> DE; DE-side hits go to the
    // PE GPU once per layer and never come back.
    CHECK_EQ(r.bytes_pe_to_de,
             kv_bytes(tokens.size() - de_side * block_tokens));
    CHECK_EQ(r.bytes_de_to_pe, kv_bytes(de_side * block_tokens));
    CHECK_EQ(r.bytes_compute_net, r.bytes_pe_to_de + r.bytes_de_to_pe);
    CHECK_EQ(rep.layers.size(), layers);
    CHECK_GT(r.ttft_ns, 0);
    CHECK_GT(r.tpot_ns, 0);
    CHECK_GE(r.ttst_ns, r.ttft_ns);
    CHECK_GE(r.done_ns, r.ttst_ns);
    // Residency: at most the window of layers of the batch at once.
    CHECK_LE(c.pe.device->peak_bytes_allocated(), 2 * tokens.size() * bpt);
    CHECK_GT(c.pe.device->peak_bytes_allocated(), 0u);
    CHECK_EQ(c.pe.device->bytes_allocated(), 0u);
    CHECK_EQ(c.de.device->bytes_allocated(), 0u);
  }
}

TEST_CASE("Layer Blocks land exact in the prefill GPU memory, pushed or "
          "staged") {
  // DE-side Layer Blocks are pushed straight into the prefill engine's GPU
  // memory when that is registered for RDMA (here: the host backend's
  // stand-in, its whole budget one pool slab registered with the bulk
  // transport), else into the host staging and copied in, said once. Either
  // way every layer's GPU memory ends up holding the prompt's exact KV: the
  // window covers all layers, so layer l sits at slab offset l * (its size
  // rounded to 256 B), and the host pool leaves freed bytes in place.
  for (bool registered : {true, false}) {
    CAPTURE(registered);
    std::shared_ptr<gpu::device> pe_gpu;
    std::vector<std::string> notices;
    auto tweak = [&](engine_config& c) {
      if (c.id.role != engine_role::prefill)
        return;
      gpu::device_options d;
      d.backend = gpu::backend_choice::host;
      d.hbm_budget = 1 << 20;
      d.pool_reserve = registered ? d.hbm_budget : 0;
      auto dev = gpu::make_host_device(d);
      REQUIRE(dev);
      pe_gpu = *dev;
      c.device = pe_gpu;
      c.notice = [&notices](const std::string& line) {
        notices.push_back(line);
      };
    };
    cluster c{load_mode::dualpath, layers, tweak};
    auto tokens = cluster::prompt(8, 4, 2); // 4 full blocks + 2 tokens
    c.populate(tokens, 3);
    auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{3, 1})});
    REQUIRE_EQ(res.size(), 1u);
    CHECK_EQ(res[0].verify_failures, 0u);
    CHECK_EQ(res[0].blocks_verified, 5u);
    CHECK_EQ(res[0].bytes_de_to_pe, kv_bytes(2 * block_tokens));
    if (registered) {
      CHECK(notices.empty());
    } else {
      REQUIRE_EQ(notices.size(), 1u);
      CHECK(notices[0].find("not registered for RDMA") != std::string::npos);
    }
    auto slabs = pe_gpu->slabs();
    REQUIRE_EQ(slabs.size(), 1u);
    auto hashes = prompt_block_hashes(tokens, block_tokens);
    const size_t layer_bytes = tokens.size() * bpt;
    const size_t stride = (layer_bytes + 255) / 256 * 256;
    for (uint32_t l = 0; l < layers; ++l) {
      CAPTURE(l);
      auto base = slabs[0].base + l * stride;
      uint32_t wrong = 0;
      for (uint32_t t = 0; t < tokens.size(); ++t)
        if (!storage::kv_check_token(hashes[t / block_tokens], l,
                                     t % block_tokens, base + t * bpt, bpt))
          ++wrong;
      CHECK_EQ(wrong, 0u);
    }
    // Copies were submitted (and waited for) as lists, none left behind.
    auto st = pe_gpu->stats();
    CHECK_GT(st.copy_lists, 0u);
    CHECK_EQ(pe_gpu->bytes_allocated(), 0u);
  }
}

TEST_CASE("GPU residency never exceeds the window over a batch") {
  for (uint32_t window : {1u, 2u, 3u}) {
    CAPTURE(window);
    cluster c{load_mode::layerwise, window};
    auto t1 = cluster::prompt(2, 3, 1);
    auto t2 = cluster::prompt(3, 2, 3);
    c.populate(t1, 2);
    c.populate(t2, 1);
    auto res = c.run({c.make(spec(1, t1, 2, {}), read_plan{2, 0}),
                      c.make(spec(2, t2, 2, {}), read_plan{1, 0})});
    REQUIRE_EQ(res.size(), 2u);
    for (auto& r : res)
      CHECK_EQ(r.verify_failures, 0u);
    // A prefill engine streams one request at a time (a batch of several is
    // split, see prefill_engine.cpp), so the window holds layers of the
    // largest request.
    uint64_t layer = std::max(t1.size(), t2.size()) * bpt;
    CHECK_LE(c.pe.device->peak_bytes_allocated(), window * layer);
    CHECK_GE(c.pe.device->peak_bytes_allocated(), layer);
    // layerwise reads everything on the PE side, whatever the plan said.
    CHECK_EQ(c.de.counters->blocks_read.load(), 0u);
    CHECK_EQ(c.pe.counters->blocks_read.load(), 3u);
  }
}

TEST_CASE("completed blocks are persisted byte-exact and hit the next turn") {
  cluster c{load_mode::dualpath};
  auto tokens = cluster::prompt(4, 3, 2); // 3 full blocks + 2 tokens
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
  // The prompt's own partial block (2 tokens) was never persisted either.
  CHECK_FALSE(c.store->contains(prompt_block_hashes(tokens, block_tokens)[3]));
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
  cluster c{load_mode::oracle};
  auto tokens = cluster::prompt(5, 3, 3);
  c.populate(tokens, 3);
  stream_report rep;
  auto res =
      c.run({c.make(spec(1, tokens, 3, {1, 2, 3}), read_plan{3, 1})}, &rep);
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
  CHECK_EQ(rep.bytes_moved, 0u);
  CHECK_EQ(c.pe.counters->blocks_read.load(), 0u);
  CHECK_EQ(c.de.counters->blocks_read.load(), 0u);
  CHECK_EQ(c.pe.node->bulk->stats().bytes_sent[1], 0u);
  CHECK_EQ(c.de.node->bulk->stats().bytes_sent[1], 0u);
  CHECK_EQ(c.pe.device->peak_bytes_allocated(), 0u);
  CHECK_GT(r.ttft_ns, 0); // compute time only
}

TEST_CASE("Basic reads only on the prefill side and loads every layer first") {
  cluster c{load_mode::basic};
  auto tokens = cluster::prompt(6, 3, 1);
  c.populate(tokens, 3);
  auto res = c.run({c.make(spec(1, tokens, 2, {}), read_plan{3, 0})});
  REQUIRE_EQ(res.size(), 1u);
  auto& r = res[0];
  CHECK_EQ(r.verify_failures, 0u);
  CHECK_EQ(r.bytes_read_de, 0u);
  CHECK_EQ(c.de.counters->blocks_read.load(), 0u);
  CHECK_EQ(c.pe.counters->blocks_read.load(), 3u);
  CHECK_EQ(r.bytes_de_to_pe, 0u);
  CHECK_EQ(r.bytes_pe_to_de, kv_bytes(tokens.size()));
  // The whole prompt KV was resident at once (no layerwise).
  CHECK_EQ(c.pe.device->peak_bytes_allocated(), layers * tokens.size() * bpt);
}

TEST_CASE("a storage read error becomes recomputed misses, still byte-exact") {
  for (uint32_t pe_side : {3u, 0u}) {
    CAPTURE(pe_side);
    cluster c{load_mode::dualpath};
    auto tokens = cluster::prompt(7, 4, 1);
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

TEST_CASE("layerwise loads overlap compute; Basic loads everything first") {
  // Every layer's PE-side hits take 50 ms on the PE's CNIC (receive side),
  // every layer computes in 50 ms. Layerwise (window 2): the first load, then
  // the loads hide behind compute: about 5 x 50 ms. Basic: 4 loads, then 4
  // computes: about 8 x 50 ms.
  const auto step = milliseconds(50);
  auto tokens = cluster::prompt(8, 3, 2); // 12 hit tokens, 2 miss tokens
  const uint64_t hit_bytes_per_layer = 12 * bpt;
  auto tweak = [&](engine_config& cfg) {
    auto probe = cfg;
    probe.gpu_flops = 1;
    double flops = prefill_layer_seconds(probe, {gpu::sequence_shape{12, 2}});
    cfg.gpu_flops = flops / duration<double>(step).count();
    if (cfg.id.role == engine_role::prefill)
      cfg.node->cnic_rx[0] = std::make_shared<emulated_link>(
          "pe.cnic_rx0", hit_bytes_per_layer * 1000 / step.count());
  };
  auto ttft = [&](load_mode m) {
    cluster c{m, 2, tweak, 1.0};
    c.populate(tokens, 3);
    auto r = spec(1, tokens, 1, {});
    r.arrival_ns = c.time.since_start_ns(steady_clock::now());
    auto res = c.run({c.make(std::move(r), read_plan{3, 3})});
    REQUIRE_EQ(res.size(), 1u);
    CHECK_EQ(res[0].verify_failures, 0u);
    return nanoseconds(res[0].ttft_ns);
  };
  auto layerwise = ttft(load_mode::layerwise);
  auto basic = ttft(load_mode::basic);
  MESSAGE("TTFT layerwise " << layerwise.count() / 1e6 << " ms, basic "
                            << basic.count() / 1e6 << " ms");
  CHECK_GE(layerwise, 5 * step);
  CHECK_GE(basic, 8 * step);
  CHECK_LT(layerwise, basic - 3 * step / 2);
}

TEST_CASE("the next request's reads overlap the current one's compute") {
  // Two requests of 3 hit blocks each in one batch, Basic mode. Reading one
  // request on the PE's storage NIC takes 200 ms, computing it 200 ms
  // (4 layers x 50 ms). With a look-ahead of one request the second read
  // runs during the first compute: the second TTFT is about
  // 200 + 200 + 200 ms. Without look-ahead every request reads, then
  // computes: about 4 x 200 ms.
  const auto step = milliseconds(50);
  const uint64_t read_bytes = 3 * block_tokens * layers * bpt;
  const uint64_t snic = read_bytes * 1000 / 200; // 200 ms per request
  auto first = cluster::prompt(11, 3, 2);
  auto second = cluster::prompt(12, 3, 2);
  auto second_ttft = [&](uint32_t lookahead) {
    auto tweak = [&](engine_config& cfg) {
      auto probe = cfg;
      probe.gpu_flops = 1;
      double flops = prefill_layer_seconds(probe, {gpu::sequence_shape{12, 2}});
      cfg.gpu_flops = flops / duration<double>(step).count();
      cfg.prefill_lookahead = lookahead;
    };
    cluster c{load_mode::basic, 2, tweak, 1.0, snic};
    c.populate(first, 3);
    c.populate(second, 3);
    auto now = c.time.since_start_ns(steady_clock::now());
    auto a = spec(1, first, 1, {});
    auto b = spec(2, second, 1, {});
    a.arrival_ns = b.arrival_ns = now;
    auto res = c.run({c.make(std::move(a), read_plan{3, 3}),
                      c.make(std::move(b), read_plan{3, 3})});
    REQUIRE_EQ(res.size(), 2u);
    nanoseconds out{0};
    for (auto& r : res) {
      CHECK_EQ(r.verify_failures, 0u);
      CHECK_EQ(r.blocks_verified, 4u); // 3 full blocks and the tail
      if (r.id == 2)
        out = nanoseconds(r.ttft_ns);
    }
    return out;
  };
  auto pipelined = second_ttft(1);
  auto serial = second_ttft(0);
  MESSAGE("second TTFT: look-ahead 1 " << pipelined.count() / 1e6
                                       << " ms, look-ahead 0 "
                                       << serial.count() / 1e6 << " ms");
  CHECK_GE(pipelined, 12 * step);
  CHECK_GE(serial, 16 * step);
  // Expected gap: one request's read (4 steps); scheduling noise on a busy
  // machine only adds delay to both.
  CHECK_LT(pipelined, serial - 2 * step);
}
