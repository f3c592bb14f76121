// ctest-label: storage
// ctest-links: CAF::io
// The storage reader actor against a real block store on disk: byte-exact
// leases and failed blocks as misses, the buffer budget holding while the
// queue is longer than the budget, FIFO order, read_q accounting, persistence
// (also on a full disk), pacing at the configured rate in real time (within
// 5% over more than 2 s) and exactly under simulated time; the leases of a
// holder that goes down (an actor that exits, a client process killed with
// SIGKILL across the middleman) freed by the reader, and no others.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <optional>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/protocol/register.hpp"
#include "actors/storage/storage_reader.hpp"
#include "tests/actors/actor_config.hpp"
#include "tests/sanitizers.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/faulty_backend.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace dualpath::transport::storage;
using namespace std::chrono;

namespace {

struct env {
  test::temp_dir dir{"dp-reader"};
  std::shared_ptr<faulty_backend> faulty;
  std::shared_ptr<block_store> store;
  std::vector<std::vector<uint32_t>> prompts;

  explicit env(kv_geometry geo, size_t prompts_n = 4, size_t blocks = 4) {
    auto inner = make_backend(backend_config{backend_kind::automatic, 8});
    REQUIRE(inner);
    faulty = std::make_shared<faulty_backend>(*inner);
    auto s = block_store::open(store_config{dir.path(), "m", geo}, faulty);
    REQUIRE(s);
    store = std::move(*s);
    for (size_t p = 0; p < prompts_n; ++p) {
      std::vector<uint32_t> t;
      for (size_t i = 0; i < blocks * geo.block_tokens; ++i)
        t.push_back(static_cast<uint32_t>(p * 100000 + i));
      prompts.push_back(std::move(t));
    }
    REQUIRE(populate(*store, prompts));
  }

  std::shared_ptr<buffer_pool> pool(uint32_t slots) {
    auto file = store->geometry().file_bytes();
    auto p = buffer_pool::make(slots * file, file);
    REQUIRE(p);
    return *p;
  }

  read_request request(uint64_t id, size_t prompt, size_t first, size_t n) {
    auto hashes = block_hashes(prompts[prompt], store->geometry().block_tokens);
    read_request r;
    r.request_id = id;
    r.first_block = static_cast<uint32_t>(first);
    r.blocks.assign(hashes.begin() + first, hashes.begin() + first + n);
    r.tokens = static_cast<uint32_t>(n * store->geometry().block_tokens);
    return r;
  }
};

caf::actor_system_config& with_types(caf::actor_system_config& cfg) {
  add_message_types(cfg);
  return cfg;
}

// An actor system in simulated time (CAF's test coordinator).
struct simulated_config : test::actor_config {
  simulated_config() : test::actor_config("testing") {
  }
};

// A reader on `slots` pool slots with inline I/O (fully deterministic), its
// storage NIC paced at 3200 B/s: one 3200-byte payload per second.
storage_reader_config inline_paced(env& e, uint32_t slots) {
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = e.pool(slots);
  rc.io_threads = 0;
  rc.pace = pace_with(std::make_shared<transport::link_pacer>(3200));
  return rc;
}

// inline_paced() for modeled reads (a simulation's reader).
storage_reader_config modeled_paced(env& e, uint32_t slots,
                                    uint32_t max_inflight) {
  auto rc = inline_paced(e, slots);
  rc.modeled_reads = true;
  rc.max_inflight = max_inflight;
  return rc;
}

// The deterministic coordinator of a system built with simulated_config.
caf::scheduler::test_coordinator& coordinator_of(caf::actor_system& sys) {
  return dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
}

bool lease_is_exact(const buffer_lease& l, const buffer_pool& pool,
                    const kv_geometry& geo) {
  if (l.region.length != geo.payload_bytes()
      || l.region.base != reinterpret_cast<uint64_t>(pool.base()))
    return false;
  return test::layers_exact(l, pool, geo);
}

// An actor that does nothing until it is told to exit: a lease holder.
caf::actor spawn_holder(caf::actor_system& sys) {
  return sys.spawn(
      [](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
}

// Waits up to 10 s for the pool to hold `n` slots; the last count seen.
size_t wait_in_use(const buffer_pool& pool, size_t n) {
  auto until = steady_clock::now() + seconds{10};
  while (pool.in_use() != n && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds{5});
  return pool.in_use();
}

struct io_config : caf::actor_system_config {
  io_config() {
    dualpath::actors::add_message_types(*this);
    load<caf::io::middleman>();
  }
};

} // namespace

TEST_CASE("reads lease byte-exact blocks and list failed ones as misses") {
  env e{kv_geometry{4, 8, 100}};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto pool = e.pool(8);
  auto counters = std::make_shared<storage_reader_counters>();
  storage_reader_config rc;
  rc.node = "n0";
  rc.region_id = 7;
  rc.region_key = 99;
  rc.store = e.store;
  rc.pool = pool;
  rc.counters = counters;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  auto req = e.request(1, 0, 0, 4);
  req.blocks[2] = 0xbadbad; // not in the store
  // Block 3's file is corrupt on disk (layer 1).
  fault_plan plan;
  plan.path_filter = e.store->path_of(req.blocks[3]);
  plan.corrupt_offset =
      static_cast<int64_t>(e.store->geometry().layer_offset(1) + 3);
  e.faulty->set_plan(plan);
  caf::scoped_actor self{sys};
  read_completion done;
  self->request(*reader, caf::infinite, read_atom_v, req)
      .receive([&](read_completion& c) { done = std::move(c); },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  CHECK_EQ(done.request_id, 1u);
  REQUIRE_EQ(done.leases.size(), 2u);
  CHECK(done.failed == std::vector<block_hash>{0xbadbad, req.blocks[3]});
  // Each failure says why: the block is missing, the layer is damaged.
  REQUIRE_EQ(done.why_failed.size(), 2u);
  CHECK(done.why_failed[0] == storage_errc::missing_block);
  CHECK(done.why_failed[1] == storage_errc::layer_checksum);
  for (size_t i = 0; i < 2; ++i) {
    auto& l = done.leases[i];
    CHECK_EQ(l.hash, req.blocks[i]);
    CHECK_EQ(l.block_index, i);
    CHECK_EQ(l.region.node, "n0");
    CHECK_EQ(l.region.region_id, 7u);
    CHECK_EQ(l.region.key, 99u);
    CHECK(lease_is_exact(l, *pool, e.store->geometry()));
  }
  CHECK_EQ(counters->blocks_failed.load(), 2u);
  CHECK_EQ(counters->blocks_read.load(), 2u);
  CHECK_EQ(pool->in_use(), 2u); // failed blocks hold no slot
  for (auto& l : done.leases)
    self->send(*reader, release_atom_v, l.lease_id);
  self->send(*reader, release_atom_v, done.leases[0].lease_id); // twice: no-op
  read_queue_status q;
  self->request(*reader, caf::infinite, queue_atom_v)
      .receive([&](read_queue_status& s) { q = s; },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  CHECK_EQ(q.requests, 0u);
  CHECK_EQ(pool->in_use(), 0u);
  // Every read in flight holds a slot; failed ones give it back at once.
  CHECK_EQ(pool->high_water(), 4u);
}

TEST_CASE("the buffer budget holds while the queue is longer than it") {
  env e{kv_geometry{4, 8, 100}};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto pool = e.pool(4);
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = pool;
  rc.io_threads = 2;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  // Five requests of two blocks each: 10 blocks for a budget of 4.
  for (uint64_t r = 0; r < 5; ++r)
    self->send(*reader, read_atom_v, e.request(r, r % 4, 2 * (r / 4), 2));
  std::vector<read_completion> done;
  auto receive_one = [&](milliseconds timeout) {
    bool got = false;
    self->receive(
        [&](read_completion& c) {
          done.push_back(std::move(c));
          got = true;
        },
        [&](caf::error& err) { FAIL(sys.render(err)); },
        caf::after(timeout) >> [] {});
    return got;
  };
  REQUIRE(receive_one(seconds{5}));
  REQUIRE(receive_one(seconds{5}));
  // The budget is used up: the third request waits.
  CHECK_FALSE(receive_one(milliseconds{300}));
  CHECK_EQ(pool->in_use(), 4u);
  CHECK_LE(pool->high_water(), 4u);
  read_queue_status q;
  self->request(*reader, caf::infinite, queue_atom_v)
      .receive([&](read_queue_status& s) { q = s; },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  CHECK_EQ(q.requests, 3u);
  CHECK_EQ(q.tokens, 3u * 16u);
  CHECK_EQ(q.bytes, 3u * 2u * e.store->geometry().payload_bytes());
  // FIFO: requests are issued in submission order as leases are released.
  // The first two are issued together and run on two I/O threads, so they
  // may complete in either order; the later ones wait for released slots.
  CHECK_EQ(std::min(done[0].request_id, done[1].request_id), 0u);
  CHECK_EQ(std::max(done[0].request_id, done[1].request_id), 1u);
  for (size_t k = 0; k < 3; ++k) {
    for (auto& l : done[k].leases)
      self->send(*reader, release_atom_v, l.lease_id);
    REQUIRE(receive_one(seconds{5}));
    CHECK_EQ(done.back().request_id, k + 2);
    CHECK_EQ(done.back().leases.size(), 2u);
    CHECK(lease_is_exact(done.back().leases[0], *pool, e.store->geometry()));
    CHECK_LE(pool->in_use(), 4u);
  }
  CHECK_EQ(pool->high_water(), 4u);
  // A request larger than the whole pool fails instead of waiting forever.
  REQUIRE_FALSE(e.store->write_generated(0x5555, 0));
  read_request big = e.request(10, 0, 0, 4);
  big.blocks.push_back(0x5555);
  self->request(*reader, caf::infinite, read_atom_v, big)
      .receive([&](read_completion&) { FAIL("expected over_budget"); },
               [&](caf::error& err) {
                 CHECK(has_code(err, storage_errc::over_budget));
               });
}

TEST_CASE("a reservation not served within its timeout takes no slot") {
  env e{kv_geometry{4, 8, 100}};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto pool = e.pool(2);
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = pool;
  rc.io_threads = 1;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  auto reserve = [&](reserve_request rq) {
    caf::expected<read_completion> out{read_completion{}};
    self->request(*reader, caf::infinite, reserve_atom_v, std::move(rq))
        .receive([&](read_completion& c) { out = std::move(c); },
                 [&](caf::error& err) { out = std::move(err); });
    return out;
  };
  // A reservation with a timeout that can be served is served.
  auto held = reserve(reserve_request{1, {0, 1}, 1'000'000'000});
  REQUIRE(held);
  REQUIRE_EQ(held->leases.size(), 2u);
  CHECK_EQ(pool->in_use(), 2u);
  // The pool is full: one with a 200 ms timeout is answered with
  // request_timeout then, although nothing else happens at the reader.
  auto t0 = std::chrono::steady_clock::now();
  auto late = reserve(reserve_request{2, {0}, 200'000'000});
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(late);
  CHECK(late.error() == caf::sec::request_timeout);
  CHECK(waited >= milliseconds{200});
  CHECK(waited < seconds{2});
  // Released slots do not go to the dropped reservation: the whole pool
  // is free for the next one.
  for (auto& l : held->leases)
    self->send(*reader, release_atom_v, l.lease_id);
  // A negative timeout is refused (not taken as "no limit").
  auto negative = reserve(reserve_request{4, {0}, -1});
  REQUIRE_FALSE(negative);
  CHECK(negative.error() == caf::sec::invalid_argument);
  CHECK(sys.render(negative.error()).find("timeout_ns") != std::string::npos);
  CHECK_EQ(pool->in_use(), 0u);
  auto next = reserve(reserve_request{3, {0, 1}, 0});
  REQUIRE(next);
  CHECK_EQ(next->leases.size(), 2u);
  CHECK_EQ(pool->in_use(), 2u);
  for (auto& l : next->leases)
    self->send(*reader, release_atom_v, l.lease_id);
}

TEST_CASE("persistence writes blocks, from a region or generated") {
  env e{kv_geometry{4, 8, 100}, 1, 2};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto pool = e.pool(4);
  auto counters = std::make_shared<storage_reader_counters>();
  storage_reader_config rc;
  rc.node = "n0";
  rc.region_id = 3;
  rc.store = e.store;
  rc.pool = pool;
  rc.counters = counters;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  auto geo = e.store->geometry();
  // Generated content for a new block.
  persist_request pr;
  pr.hash = 0x1234;
  pr.parent = 0;
  pr.tokens = geo.block_tokens;
  self->request(*reader, caf::infinite, persist_atom_v, pr)
      .receive([&](block_hash h) { CHECK_EQ(h, 0x1234u); },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  CHECK(e.store->contains(0x1234));
  auto buf = aligned_buffer::make(geo.file_bytes());
  REQUIRE(buf);
  REQUIRE(e.store->read_full(0x1234, buf->data()));
  CHECK(kv_check_layer(0x1234, 2, geo.block_tokens, geo.bytes_per_token_layer,
                       buf->data() + geo.layer_offset(2)));
  // From a region: the bytes of a leased block, persisted under a new hash.
  read_completion rd;
  self->request(*reader, caf::infinite, read_atom_v, e.request(1, 0, 0, 1))
      .receive([&](read_completion& c) { rd = std::move(c); },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  REQUIRE_EQ(rd.leases.size(), 1u);
  pr.hash = 0x9999;
  pr.source = rd.leases[0].region;
  self->request(*reader, caf::infinite, persist_atom_v, pr)
      .receive([&](block_hash h) { CHECK_EQ(h, 0x9999u); },
               [&](caf::error& err) { FAIL(sys.render(err)); });
  REQUIRE(e.store->read_full(0x9999, buf->data()));
  CHECK(std::equal(buf->data() + header_bytes,
                   buf->data() + header_bytes + geo.payload_bytes(),
                   pool->base() + rd.leases[0].region.offset));
  // Disk full: a typed error, counted, nothing indexed.
  fault_plan full;
  full.disk_full = true;
  e.faulty->set_plan(full);
  pr.hash = 0x7777;
  pr.source = {};
  self->request(*reader, caf::infinite, persist_atom_v, pr)
      .receive([&](block_hash) { FAIL("expected disk_full"); },
               [&](caf::error& err) {
                 CHECK(has_code(err, storage_errc::disk_full));
               });
  CHECK_FALSE(e.store->contains(0x7777));
  CHECK_EQ(counters->blocks_written.load(), 2u);
  CHECK_EQ(counters->writes_failed.load(), 1u);
}

TEST_CASE("reads are paced to the configured rate in real time") {
  // 128 KiB blocks at 4 MiB/s: 32 blocks per second.
  env e{kv_geometry{8, 16, 1024}, 20, 4};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto geo = e.store->geometry();
  const uint64_t rate = 4u << 20;
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = e.pool(16);
  rc.pace = pace_with(std::make_shared<transport::link_pacer>(rate));
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  for (uint64_t r = 0; r < 20; ++r)
    self->send(*reader, read_atom_v, e.request(r, r, 0, 4));
  std::vector<steady_clock::time_point> at;
  for (int r = 0; r < 20; ++r) {
    self->receive(
        [&](read_completion& c) {
          at.push_back(steady_clock::now());
          CHECK_EQ(c.leases.size(), 4u);
          for (auto& l : c.leases)
            self->send(*reader, release_atom_v, l.lease_id);
        },
        [&](caf::error& err) { FAIL(sys.render(err)); });
  }
  // Bytes completed after the first completion over the time they took.
  auto window = duration<double>(at.back() - at.front()).count();
  auto bytes = 19.0 * 4 * geo.payload_bytes();
  auto measured = bytes / window;
  MESSAGE("paced " << measured / (1 << 20) << " MiB/s over " << window
                   << " s, configured " << rate / (1 << 20) << " MiB/s");
  CHECK_GE(window, 2.0);
  // Never faster than the link (the pacing's promise); slower only by what a
  // loaded machine costs the pacer's timer (the exact rate is checked in
  // simulated time: "pacing and persistence follow simulated time").
  CHECK_LE(measured, rate * 1.02);
  CHECK_GE(measured, rate * 0.5);
}

TEST_CASE("one block in flight: requests completing before the next pump") {
  // With max_inflight = 1 a request's last block completes while the request
  // still heads the FIFO; the reader must move on, not trip over it.
  env e{kv_geometry{4, 8, 100}};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = e.pool(2);
  rc.max_inflight = 1;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  for (uint64_t r = 0; r < 6; ++r)
    self->send(*reader, read_atom_v, e.request(r, r % 4, r / 4, 1));
  for (uint64_t r = 0; r < 6; ++r)
    self->receive(
        [&](read_completion& c) {
          CHECK_EQ(c.request_id, r);
          REQUIRE_EQ(c.leases.size(), 1u);
          self->send(*reader, release_atom_v, c.leases[0].lease_id);
        },
        [&](caf::error& err) { FAIL(sys.render(err)); },
        caf::after(seconds{5}) >> [&] { FAIL("request " << r << " stuck"); });
}

TEST_CASE("pacing and persistence follow simulated time") {
  env e{kv_geometry{4, 8, 100}, 1, 2}; // 3200-byte payloads
  simulated_config cfg;
  caf::actor_system sys{cfg};
  auto& sched = coordinator_of(sys);
  auto rc = inline_paced(e, 4);
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  std::optional<read_completion> got;
  std::optional<block_hash> persisted;
  auto req = e.request(1, 0, 0, 2);
  sys.spawn([&](caf::event_based_actor* client) {
    client->request(*reader, caf::infinite, read_atom_v, req)
        .then([&](read_completion& c) { got = std::move(c); });
    persist_request pr;
    pr.hash = 0x4242;
    client->request(*reader, caf::infinite, persist_atom_v, pr)
        .then([&](block_hash h) { persisted = h; });
  });
  sched.run();
  CHECK_FALSE(got);
  // Two 3200-byte blocks at 3200 B/s complete after exactly 2 s.
  sched.advance_time(milliseconds{1999});
  sched.run();
  CHECK_FALSE(got);
  sched.advance_time(milliseconds{1});
  sched.run();
  REQUIRE(got);
  CHECK_EQ(got->leases.size(), 2u);
  // The persisted block shares the NIC: it finishes after the reads, at 3 s.
  CHECK_FALSE(persisted);
  sched.advance_time(milliseconds{999});
  sched.run();
  CHECK_FALSE(persisted);
  sched.advance_time(milliseconds{1});
  sched.run();
  REQUIRE(persisted);
  CHECK_EQ(*persisted, 0x4242u);
  CHECK(e.store->contains(0x4242));
}

TEST_CASE("a persist batch: each block paced, one reply, a failure ends it") {
  env e{kv_geometry{4, 8, 100}, 1, 2}; // 3200-byte payloads at 3200 B/s
  simulated_config cfg;
  caf::actor_system sys{cfg};
  auto& sched = coordinator_of(sys);
  auto rc = inline_paced(e, 4);
  rc.counters = std::make_shared<storage_reader_counters>();
  auto counters = rc.counters;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  auto geo = e.store->geometry();
  std::optional<uint32_t> written;
  std::optional<caf::error> refused;
  auto send = [&](persist_batch b) {
    written.reset();
    refused.reset();
    sys.spawn([&, b](caf::event_based_actor* client) {
      client->request(*reader, caf::infinite, persist_atom_v, b)
          .then([&](uint32_t n) { written = n; },
                [&](caf::error& err) { refused = err; });
    });
    sched.run();
  };
  // Three chained blocks: the reply comes when the third would, at 3 s.
  send(persist_batch{{0x51, 0x52, 0x53}, 0x50, geo.block_tokens});
  sched.advance_time(milliseconds{2999});
  sched.run();
  CHECK_FALSE(written);
  sched.advance_time(milliseconds{1});
  sched.run();
  REQUIRE(written);
  CHECK_EQ(*written, 3u);
  auto buf = aligned_buffer::make(geo.file_bytes());
  REQUIRE(buf);
  for (block_hash h : {0x51, 0x52, 0x53}) {
    REQUIRE(e.store->read_full(h, buf->data()));
    CHECK(kv_check_layer(h, 1, geo.block_tokens, geo.bytes_per_token_layer,
                         buf->data() + geo.layer_offset(1)));
  }
  CHECK_EQ(counters->blocks_written.load(), 3u);
  // Writes fail after one more: the batch stops there and says how far it got.
  fault_plan failing;
  failing.fail_after = 1;
  e.faulty->set_plan(failing);
  send(persist_batch{{0x61, 0x62, 0x63}, 0x53, geo.block_tokens});
  sched.advance_time(seconds{3});
  sched.run();
  REQUIRE(written);
  CHECK_EQ(*written, 1u);
  CHECK(e.store->contains(0x61));
  CHECK_FALSE(e.store->contains(0x62));
  CHECK_FALSE(e.store->contains(0x63));
  CHECK_EQ(counters->blocks_written.load(), 4u);
  CHECK_EQ(counters->writes_failed.load(), 2u);
  e.faulty->set_plan(fault_plan{});
  // Empty and oversized batches are refused, naming the limit.
  send(persist_batch{{}, 0, geo.block_tokens});
  REQUIRE(refused);
  CHECK(has_code(*refused, storage_errc::invalid_argument));
  CHECK_NE(sys.render(*refused).find("4096"), std::string::npos);
  send(persist_batch{std::vector<block_hash>(max_persist_batch + 1, 7), 0,
                     geo.block_tokens});
  REQUIRE(refused);
  CHECK_FALSE(e.store->contains(7));
}

TEST_CASE("modeled reads: one paced completion per issue, same NIC time") {
  env e{kv_geometry{4, 8, 100}, 2, 4}; // 3200-byte payloads
  simulated_config cfg;
  caf::actor_system sys{cfg};
  auto& sched = coordinator_of(sys);
  auto rc = modeled_paced(e, 4, 4);
  std::vector<read_queue_status> published;
  rc.on_queue = [&](const read_queue_status& q) { published.push_back(q); };
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  std::optional<read_completion> first;
  std::optional<read_completion> second;
  auto req = e.request(1, 0, 0, 4);
  req.blocks[2] = 0xdead; // not in the store: a miss
  caf::actor client;
  client = sys.spawn([&](caf::event_based_actor* self) {
    self->request(*reader, caf::infinite, read_atom_v, req)
        .then([&](read_completion& c) { first = std::move(c); });
    self->request(*reader, caf::infinite, read_atom_v, e.request(2, 1, 0, 4))
        .then([&](read_completion& c) { second = std::move(c); });
  });
  size_t jobs = sched.run();
  // Four blocks at 3200 B/s: the first read completes after exactly 4 s.
  sched.advance_time(milliseconds{3999});
  jobs += sched.run();
  CHECK_FALSE(first);
  sched.advance_time(milliseconds{1});
  jobs += sched.run();
  REQUIRE(first);
  CHECK_EQ(first->leases.size(), 3u);
  REQUIRE_EQ(first->failed.size(), 1u);
  CHECK_EQ(first->failed[0], 0xdeadu);
  // Block by block would be at least two messages per block (8 here).
  CHECK_LE(jobs, 6u);
  // The pool (4 slots) is full: the second read waits for the leases, all
  // returned by one message.
  lease_release rel;
  for (auto& l : first->leases)
    rel.lease_ids.push_back(l.lease_id);
  rel.lease_ids.push_back(987654); // unknown: ignored
  caf::anon_send(*reader, release_atom_v, rel);
  sched.run();
  // The missing block's slot came back at completion, so one block of the
  // second read was already issued at 4 s; the others start now.
  sched.advance_time(milliseconds{4000});
  sched.run();
  REQUIRE(second);
  CHECK_EQ(second->leases.size(), 4u);
  CHECK(second->failed.empty());
  // The node's load board saw the queue grow and drain.
  REQUIRE_GE(published.size(), 4u);
  CHECK_EQ(published[1].requests, 2u);
  CHECK_EQ(published[1].tokens, 64u);
  CHECK_EQ(published.back().requests, 0u);
  CHECK_EQ(published.back().tokens, 0u);
}

TEST_CASE("modeled reads with lease runs: one lease per run, same NIC time") {
  env e{kv_geometry{4, 8, 100}, 2, 4}; // 3200-byte payloads, 1 s each
  simulated_config cfg;
  caf::actor_system sys{cfg};
  auto& sched = coordinator_of(sys);
  auto rc = modeled_paced(e, 4, 4);
  rc.lease_runs = true;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  std::optional<read_completion> first;
  std::optional<read_completion> second;
  std::optional<read_completion> third;
  auto req = e.request(1, 0, 0, 4);
  req.blocks[2] = 0xdead; // not in the store: a miss between two runs
  sys.spawn([&](caf::event_based_actor* self) {
    self->request(*reader, caf::infinite, read_atom_v, req)
        .then([&](read_completion& c) { first = std::move(c); });
    self->request(*reader, caf::infinite, read_atom_v, e.request(2, 1, 0, 4))
        .then([&](read_completion& c) { second = std::move(c); });
  });
  sched.run();
  sched.advance_time(milliseconds{3999});
  sched.run();
  CHECK_FALSE(first);
  sched.advance_time(milliseconds{1});
  sched.run();
  REQUIRE(first);
  // Blocks 0-1 as one lease, 2 failed, 3 alone; no bytes behind them.
  REQUIRE_EQ(first->leases.size(), 2u);
  CHECK_EQ(first->leases[0].block_index, 0u);
  CHECK_EQ(first->leases[0].blocks, 2u);
  CHECK_EQ(first->leases[0].hash, req.blocks[0]);
  CHECK_EQ(first->leases[1].block_index, 3u);
  CHECK_EQ(first->leases[1].blocks, 1u);
  CHECK_EQ(first->leases[1].hash, req.blocks[3]);
  CHECK_EQ(first->leases[0].region.length, 0u);
  CHECK_NE(first->leases[0].lease_id, first->leases[1].lease_id);
  REQUIRE_EQ(first->failed.size(), 1u);
  CHECK_EQ(first->failed[0], 0xdeadu);
  REQUIRE_EQ(first->why_failed.size(), 1u);
  CHECK(first->why_failed[0] == storage_errc::missing_block);
  // The pool's 4 places: 3 leased, the missing block's given back, so one
  // block of the second read went out at 4 s. Releasing each run twice and
  // an unknown id frees exactly the 3 places.
  lease_release rel;
  for (auto& l : first->leases)
    rel.lease_ids.push_back(l.lease_id);
  for (auto& l : first->leases)
    rel.lease_ids.push_back(l.lease_id);
  rel.lease_ids.push_back(uint64_t{1} << 63 | 999);
  caf::anon_send(*reader, release_atom_v, rel);
  sched.run();
  sched.advance_time(milliseconds{3999});
  sched.run();
  CHECK_FALSE(second);
  sched.advance_time(milliseconds{1});
  sched.run();
  REQUIRE(second);
  CHECK(second->failed.empty());
  uint32_t blocks = 0;
  uint32_t next = 0;
  for (auto& l : second->leases) {
    CHECK_EQ(l.block_index, next); // in block order, no gap
    next += l.blocks;
    blocks += l.blocks;
  }
  CHECK_EQ(blocks, 4u);
  CHECK_EQ(second->leases.size(), 2u); // the block issued at 4 s, then 3
  // Released, the 4 places serve a third read of 4 blocks in 4 s: none
  // was freed twice or lost.
  lease_release rel2;
  for (auto& l : second->leases)
    rel2.lease_ids.push_back(l.lease_id);
  caf::anon_send(*reader, release_atom_v, rel2);
  sys.spawn([&](caf::event_based_actor* self) {
    self->request(*reader, caf::infinite, read_atom_v, e.request(3, 0, 0, 4))
        .then([&](read_completion& c) { third = std::move(c); });
  });
  sched.run();
  sched.advance_time(milliseconds{4000});
  sched.run();
  REQUIRE(third);
  REQUIRE_EQ(third->leases.size(), 1u);
  CHECK_EQ(third->leases[0].blocks, 4u);
  // A fifth place never existed: with all 4 leased, a read waits.
  std::optional<read_completion> fourth;
  sys.spawn([&](caf::event_based_actor* self) {
    self->request(*reader, caf::infinite, read_atom_v, e.request(4, 1, 0, 1))
        .then([&](read_completion& c) { fourth = std::move(c); });
  });
  sched.run();
  sched.advance_time(milliseconds{10000});
  sched.run();
  CHECK_FALSE(fourth);
  caf::anon_send(*reader, release_atom_v, third->leases[0].lease_id);
  sched.run();
  sched.advance_time(milliseconds{1000});
  sched.run();
  CHECK(fourth);
}

TEST_CASE("modeled reads: runs of half the budget, the NIC kept busy") {
  env e{kv_geometry{4, 8, 100}, 2, 40}; // 3200-byte payloads, 1 s each
  simulated_config cfg;
  caf::actor_system sys{cfg};
  auto& sched = coordinator_of(sys);
  auto rc = modeled_paced(e, 64, 8);
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  std::optional<read_completion> a;
  std::optional<read_completion> b;
  // A takes 3 places, B (40 blocks) the other 5. Issued into whatever is
  // free, B would go on in runs of 3 and 5 (A's and its own first run).
  sys.spawn([&](caf::event_based_actor* self) {
    self->request(*reader, caf::infinite, read_atom_v, e.request(1, 0, 0, 3))
        .then([&](read_completion& c) { a = std::move(c); });
    self->request(*reader, caf::infinite, read_atom_v, e.request(2, 1, 0, 40))
        .then([&](read_completion& c) { b = std::move(c); });
  });
  sched.run();
  size_t done_messages = 0;
  for (int s = 1; s <= 43; ++s) {
    sched.advance_time(milliseconds{1000});
    done_messages += sched.run();
    CHECK_EQ(b.has_value(), s == 43); // the NIC never idles: 43 blocks, 43 s
  }
  REQUIRE(a);
  REQUIRE(b);
  CHECK_EQ(a->leases.size(), 3u);
  CHECK_EQ(b->leases.size(), 40u);
  // A's run, then B's runs of 5, 8, 8, 8, 8, 3, and the two replies.
  CAPTURE(done_messages);
  CHECK_LE(done_messages, 9u);
}

TEST_CASE("a holder that goes down has its leases freed, and only its own") {
  env e{kv_geometry{4, 8, 100}};
  caf::actor_system_config cfg;
  caf::actor_system sys{with_types(cfg)};
  auto pool = e.pool(4);
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = pool;
  rc.io_threads = 1;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  caf::scoped_actor self{sys};
  auto read = [&](read_request rq) {
    caf::expected<read_completion> out{read_completion{}};
    self->request(*reader, seconds{10}, read_atom_v, std::move(rq))
        .receive([&](read_completion& c) { out = std::move(c); },
                 [&](caf::error& err) { out = std::move(err); });
    return out;
  };
  auto holder = spawn_holder(sys);
  auto mine = e.request(1, 0, 0, 3);
  mine.holder = holder;
  auto held = read(mine);
  REQUIRE(held);
  REQUIRE_EQ(held->leases.size(), 3u);
  CHECK(lease_is_exact(held->leases[0], *pool, e.store->geometry()));
  // The holder gives one back itself; a read without a holder takes that
  // slot again (a new lease of it, which must survive the holder).
  self->send(*reader, release_atom_v, held->leases[0].lease_id);
  auto other = read(e.request(2, 1, 0, 1));
  REQUIRE(other);
  REQUIRE_EQ(other->leases.size(), 1u);
  CHECK_EQ(pool->in_use(), 3u);
  // A reservation of the holder's that cannot be served yet (2 slots, 1
  // free) waits; when the holder goes down it is answered and dropped.
  reserve_request rq{3, {0, 1}, 0};
  rq.holder = holder;
  // (Sent, not requested: its answer arrives as an ordinary message.)
  self->send(*reader, reserve_atom_v, rq);
  caf::anon_send_exit(holder, caf::exit_reason::kill);
  // Its two leases go back, the other read's stays: one slot in use.
  CHECK_EQ(wait_in_use(*pool, 1), 1u);
  caf::error reserve_answer;
  self->receive([&](read_completion&) { FAIL("the reservation was served"); },
                [&](caf::error& err) { reserve_answer = std::move(err); },
                caf::after(seconds{10}) >>
                    [] { FAIL("no answer to the reservation"); });
  CHECK(reserve_answer == caf::sec::request_receiver_down);
  // Released by the holder already: a second release is a mismatch, and
  // the slot now leased to the other read stays leased.
  self->send(*reader, release_atom_v, held->leases[0].lease_id);
  auto next = read(e.request(4, 2, 0, 3)); // the whole rest of the pool
  REQUIRE(next);
  CHECK_EQ(next->leases.size(), 3u);
  CHECK_EQ(pool->in_use(), 4u);
  CHECK(lease_is_exact(other->leases[0], *pool, e.store->geometry()));
  for (auto& l : next->leases)
    self->send(*reader, release_atom_v, l.lease_id);
  self->send(*reader, release_atom_v, other->leases[0].lease_id);
  CHECK_EQ(wait_in_use(*pool, 0), 0u);
  // A holder gone before its read completes: the read's leases are freed
  // as it completes (the answer still goes to the requester).
  auto gone = spawn_holder(sys);
  auto late = e.request(5, 3, 0, 4);
  late.holder = gone;
  caf::anon_send_exit(gone, caf::exit_reason::kill);
  auto served = read(late);
  REQUIRE(served);
  CHECK_EQ(wait_in_use(*pool, 0), 0u);
}

// Not under TSan: it stops a forked child that starts threads when the
// parent had threads besides the forking one (die_after_fork), and this
// case should not depend on every thread of the earlier cases' actor
// systems being gone by then. The case above covers the mechanism there.
#if !defined(DUALPATH_TEST_TSAN)
TEST_CASE("a client process killed while it holds leases leaks no slot") {
  env e{kv_geometry{4, 8, 100}};
  // The client is forked before this process starts an actor system (the
  // child makes its own), and reaches the reader over the middleman.
  int to_child[2];
  int from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  // Whatever happens below, the child does not outlive the test.
  struct reap {
    pid_t pid;
    ~reap() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    uint16_t port = 0;
    if (::read(to_child[0], &port, sizeof(port)) != sizeof(port))
      _exit(1);
    io_config ccfg;
    caf::actor_system csys{ccfg};
    auto r =
        csys.middleman().remote_actor<storage_reader_actor>("127.0.0.1", port);
    if (!r)
      _exit(2);
    auto holder = spawn_holder(csys);
    auto rq = e.request(1, 0, 0, 3);
    rq.holder = holder;
    caf::scoped_actor cself{csys};
    size_t got = 0;
    cself->request(*r, seconds{10}, read_atom_v, rq)
        .receive([&](read_completion& c) { got = c.leases.size(); },
                 [&](caf::error&) {});
    char n = static_cast<char>(got);
    if (::write(from_child[1], &n, 1) != 1)
      _exit(3);
    for (;;)
      ::pause(); // holding the leases until killed
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  io_config cfg;
  caf::actor_system sys{cfg};
  auto pool = e.pool(4);
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = e.store;
  rc.pool = pool;
  rc.io_threads = 1;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  auto port = sys.middleman().publish(*reader, 0, "127.0.0.1");
  REQUIRE_MESSAGE(port, (port ? "" : sys.render(port.error())));
  uint16_t p = *port;
  REQUIRE(::write(to_child[1], &p, sizeof(p)) == sizeof(p));
  char got = 0;
  REQUIRE(::read(from_child[0], &got, 1) == 1);
  CHECK_EQ(got, 3);
  CHECK_EQ(pool->in_use(), 3u);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  reaper.pid = -1;
  // The connection breaks, the holder's proxy goes down: all three back.
  CHECK_EQ(wait_in_use(*pool, 0), 0u);
  ::close(to_child[1]);
  ::close(from_child[0]);
  // Published, it is referenced by the middleman: it ends when told to.
  caf::anon_send_exit(*reader, caf::exit_reason::user_shutdown);
}
#endif
