// ctest-label: integration
// kv_client over real files and both nodes' real readers and local bulk
// transports: loads on each path and split land byte-exact (the store's
// deterministic KV content), saves reload byte-exact, a damaged file is a
// per-block error, a slow read fails its load at the deadline, a decode
// node lost mid-load (fault-injected transport) fails the load at once, bad
// input is refused naming what was wrong.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "actors/client/kv_client.hpp"
#include "actors/protocol/register.hpp"
#include "tests/actors/client/client_support.hpp"
#include "tests/support/support.hpp"
#include "tests/support/thread_sched.hpp"
#include "transport/errors.hpp"
#include "transport/storage/backend.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors::client;
using namespace dualpath::transport::storage;

namespace {

constexpr uint32_t layers = 3;
constexpr uint32_t block_tokens = 4;
constexpr uint32_t bpt = 64; // bytes per token per layer
constexpr uint32_t pages = 16;

kv_geometry geometry() {
  return kv_geometry{layers, block_tokens, bpt};
}

std::vector<uint32_t> prompt(uint32_t blocks, uint32_t salt = 0) {
  return test::client_prompt(blocks, block_tokens, salt);
}

struct env {
  test::temp_dir dir{"dp-client"};
  std::vector<std::vector<std::byte>> memory;
  std::unique_ptr<kv_client> client;

  explicit env(uint64_t snic_bytes_per_s = 50'000'000'000,
               transport::bulk::fault_plan decode_faults = {},
               std::vector<std::vector<uint32_t>> stored = {prompt(6)},
               uint32_t buffer_blocks = 16) {
    // The store exists before the client, as a previous run left it.
    {
      auto be = make_backend(backend_config{});
      REQUIRE(be);
      auto s =
          block_store::open(store_config{dir.path(), "m", geometry()}, *be);
      REQUIRE(s);
      REQUIRE(populate(**s, stored));
    }
    client_config cfg;
    cfg.store_dir = dir.path();
    cfg.model_id = "m";
    cfg.geometry = geometry();
    cfg.buffer_blocks = buffer_blocks;
    cfg.snic_bytes_per_s = snic_bytes_per_s;
    cfg.decode_faults = decode_faults;
    auto c = kv_client::make(cfg);
    REQUIRE(c);
    client = std::move(*c);
    std::vector<kv_layer_memory> mem;
    memory.assign(layers,
                  std::vector<std::byte>(pages * geometry().layer_bytes()));
    for (auto& m : memory)
      mem.push_back(kv_layer_memory{m.data(), m.size()});
    REQUIRE(!client->register_kv(mem));
  }

  prefix_hit lookup(const std::vector<uint32_t>& tokens) {
    return test::lookup_hit(*client, tokens);
  }

  // A load of the stored prompt's six blocks into pages 0..5.
  load_request six_blocks(load_path path, std::chrono::milliseconds deadline) {
    load_request r;
    r.blocks = lookup(prompt(6)).blocks;
    REQUIRE(r.blocks.size() == 6);
    r.pages = {0, 1, 2, 3, 4, 5};
    r.path = path;
    r.deadline = deadline;
    return r;
  }

  const std::byte* page(uint32_t layer, uint32_t p) const {
    return memory[layer].data() + p * geometry().layer_bytes();
  }
};

} // namespace

TEST_CASE("a load lands byte-exact on the PE path, the DE path and split") {
  env e;
  auto hit = e.lookup(prompt(6));
  REQUIRE(hit.blocks.size() == 6);
  CHECK(hit.hit_tokens == 6 * block_tokens);
  for (auto path :
       {load_path::pe, load_path::de, load_path::split, load_path::automatic}) {
    CAPTURE(to_string(path));
    std::fill(e.memory.begin(), e.memory.end(),
              std::vector<std::byte>(e.memory[0].size()));
    load_request r;
    r.request_id = 7;
    r.blocks = hit.blocks;
    r.pages = {9, 3, 0, 15, 4, 8};
    r.path = path;
    auto t = e.client->start_load(r);
    REQUIRE(t);
    for (uint32_t l = 0; l < layers; ++l) {
      REQUIRE(!e.client->wait_for_layer(*t, l));
      // Layer l is complete once waited for, in every page.
      for (size_t b = 0; b < r.blocks.size(); ++b)
        CHECK(kv_check_layer(r.blocks[b], l, block_tokens, bpt,
                             e.page(l, r.pages[b])));
    }
    auto done = e.client->wait(*t);
    REQUIRE(done);
    CHECK(!done->error);
    CHECK(done->blocks_ok == 6);
    CHECK(done->request_id == 7);
    CHECK(done->pe_blocks + done->de_blocks == 6);
    if (path == load_path::pe)
      CHECK(done->de_blocks == 0);
    if (path == load_path::de)
      CHECK(done->pe_blocks == 0);
    if (path == load_path::split || path == load_path::automatic) {
      CHECK(done->pe_blocks > 0); // idle queues, equal rates: half each
      CHECK(done->de_blocks > 0);
    }
    CHECK(e.client->load_errors(*t).empty());
    auto fin = e.client->finished();
    REQUIRE(fin.size() == 1);
    CHECK(fin[0].ticket == *t);
    CHECK(e.client->finished().empty()); // reported once
  }
}

TEST_CASE("saved blocks reload byte-exact and extend the stored prefix") {
  env e;
  auto tokens = prompt(6);
  tokens.resize(9 * block_tokens + 2); // three more full blocks than stored
  std::iota(tokens.begin() + 6 * block_tokens + 1, tokens.end(), 50000u);
  CHECK(e.lookup(tokens).blocks.size() == 6);
  // The engine computed blocks 6..8 into pages 10..12 (any bytes: the
  // store keeps what the engine wrote, not generated content).
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t p = 10; p < 13; ++p)
      for (size_t i = 0; i < geometry().layer_bytes(); ++i)
        e.memory[l][p * geometry().layer_bytes() + i] =
            static_cast<std::byte>((l * 31 + p * 7 + i) & 0xff);
  save_request s;
  s.request_id = 3;
  s.tokens = tokens;
  s.first_block = 6;
  s.pages = {10, 11, 12};
  auto t = e.client->start_save(s);
  REQUIRE(t);
  auto done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(!done->error);
  auto hit = e.lookup(tokens);
  REQUIRE(hit.blocks.size() == 9);
  load_request r;
  r.blocks.assign(hit.blocks.begin() + 6, hit.blocks.end());
  r.pages = {0, 1, 2};
  r.path = load_path::de;
  auto lt = e.client->start_load(r);
  REQUIRE(lt);
  auto ld = e.client->wait(*lt);
  REQUIRE(ld);
  CHECK(!ld->error);
  CHECK(ld->blocks_ok == 3);
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t b = 0; b < 3; ++b)
      CHECK(
          std::memcmp(e.page(l, b), e.page(l, 10 + b), geometry().layer_bytes())
          == 0);
}

TEST_CASE("a block damaged in storage is a per-block load error") {
  env e;
  auto hit = e.lookup(prompt(6));
  REQUIRE(hit.blocks.size() == 6);
  // Flip a byte of layer 1 of block 2 in its real file.
  test::flip_byte(e.client->block_file(hit.blocks[2]),
                  static_cast<std::streamoff>(geometry().layer_offset(1) + 5),
                  0x5a);
  for (auto path : {load_path::pe, load_path::de}) {
    CAPTURE(to_string(path));
    load_request r;
    r.blocks = hit.blocks;
    r.pages = {0, 1, 2, 3, 4, 5};
    r.path = path;
    auto t = e.client->start_load(r);
    REQUIRE(t);
    for (uint32_t l = 0; l < layers; ++l)
      CHECK(!e.client->wait_for_layer(*t, l));
    auto done = e.client->wait(*t);
    REQUIRE(done);
    CHECK(!done->error);
    CHECK(done->blocks_ok == 2); // blocks 0 and 1; recompute from block 2
    auto errs = e.client->load_errors(*t);
    REQUIRE(errs.size() == 1);
    CHECK(errs[0].index == 2);
    CHECK(errs[0].hash == hit.blocks[2]);
    CHECK(errs[0].error == storage_errc::layer_checksum);
    for (uint32_t l = 0; l < layers; ++l)
      for (uint32_t b : {0u, 1u, 3u})
        CHECK(
            kv_check_layer(hit.blocks[b], l, block_tokens, bpt, e.page(l, b)));
    e.client->finished();
  }
}

TEST_CASE("a read slower than the deadline fails the load by the deadline") {
  // 2 KiB/s storage NICs: one 768-byte block takes ~0.4 s per read.
  env e{2048};
  auto r = e.six_blocks(load_path::split, std::chrono::milliseconds{100});
  auto t0 = std::chrono::steady_clock::now();
  auto t = e.client->start_load(r);
  REQUIRE(t);
  auto err = e.client->wait_for_layer(*t, 0);
  auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(err == caf::sec::request_timeout);
  CHECK(waited >= std::chrono::milliseconds{100});
  CHECK(waited < std::chrono::milliseconds{1000});
  auto done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(done->error == caf::sec::request_timeout);
  CHECK(done->blocks_ok == 0);
  CHECK(std::chrono::steady_clock::now() - t0
        < std::chrono::milliseconds{1000});
}

TEST_CASE("a decode node lost during a load fails the load, nothing hangs") {
  // The decode node's transport loses the engine's node at its first write.
  transport::bulk::fault_plan lost;
  lost.drop_peer = "pe0";
  env e{50'000'000'000, lost};
  auto r = e.six_blocks(load_path::split, std::chrono::milliseconds{2000});
  auto t0 = std::chrono::steady_clock::now();
  auto t = e.client->start_load(r);
  REQUIRE(t);
  auto err = e.client->wait_for_layer(*t, 0);
  CHECK(err == transport::transport_errc::peer_lost);
  auto done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(done->error == transport::transport_errc::peer_lost);
  CHECK(done->blocks_ok == 0); // nothing of a failed load counts as loaded
  CHECK(std::chrono::steady_clock::now() - t0
        < std::chrono::milliseconds{2000});
  // The engine falls back to the path that works.
  r.path = load_path::pe;
  t = e.client->start_load(r);
  REQUIRE(t);
  done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(!done->error);
  CHECK(done->blocks_ok == 6);
}

TEST_CASE("a failed load is reported only once nothing of it still writes") {
  // DE-path writes complete 300 ms late; the load's deadline is 100 ms.
  transport::bulk::fault_plan slow;
  slow.delay = std::chrono::milliseconds{300};
  env e{50'000'000'000, slow};
  auto r = e.six_blocks(load_path::de, std::chrono::milliseconds{100});
  auto t0 = std::chrono::steady_clock::now();
  auto t = e.client->start_load(r);
  REQUIRE(t);
  CHECK(e.client->wait_for_layer(*t, 0) == caf::sec::request_timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{300});
  CHECK(e.client->finished().empty()); // its batches are still in flight
  auto done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(done->error);
  CHECK(std::chrono::steady_clock::now() - t0
        >= std::chrono::milliseconds{300});
  CHECK(e.client->finished().size() == 1);
}

TEST_CASE("a save whose staging slots are not free by its deadline ends "
          "then and takes none") {
  // A six-slot buffer, its slots held by a slow PE load (2 KiB/s: ~0.4 s
  // per block) well past the save's 200 ms deadline.
  env e{2048, {}, {prompt(6)}, 6};
  auto r = e.six_blocks(load_path::pe, std::chrono::milliseconds{1000});
  auto lt = e.client->start_load(r);
  REQUIRE(lt);
  std::this_thread::sleep_for(std::chrono::milliseconds{50});
  auto tokens = prompt(8);
  save_request s;
  s.tokens = tokens;
  s.first_block = 6;
  s.pages = {10, 11};
  s.deadline = std::chrono::milliseconds{200};
  auto t0 = std::chrono::steady_clock::now();
  auto st = e.client->start_save(s);
  REQUIRE(st);
  auto done = e.client->wait(*st);
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(done);
  CHECK(done->error == caf::sec::request_timeout);
  CHECK(waited >= std::chrono::milliseconds{200});
  CHECK(waited < std::chrono::milliseconds{1000}); // not when slots free up
  CHECK(e.client->wait(*lt)); // the slow load ends (its deadline)
  e.client->finished();
  // Every slot came back: a load that needs the whole buffer succeeds once
  // the slow reads are through.
  auto full = e.six_blocks(load_path::pe, std::chrono::milliseconds{8000});
  auto ft = e.client->start_load(full);
  REQUIRE(ft);
  auto fd = e.client->wait(*ft);
  REQUIRE(fd);
  CHECK(!fd->error);
  CHECK(fd->blocks_ok == 6);
}

TEST_CASE("bad input is refused naming what was wrong") {
  env e;
  auto hit = e.lookup(prompt(6));
  load_request r;
  r.blocks = hit.blocks;
  r.pages = {0, 1};
  auto t = e.client->start_load(r);
  REQUIRE(!t);
  CHECK(t.error() == caf::sec::invalid_argument);
  r.pages = {0, 1, 2, 3, 4, pages};
  t = e.client->start_load(r);
  REQUIRE(!t);
  CHECK(e.client->finished().empty()); // nothing started
  r.pages = {0, 1, 2, 3, 4, 4};
  CHECK(!e.client->start_load(r));
  CHECK(e.client->wait_for_layer(12345, 0) == caf::sec::invalid_argument);
  r.pages = {0, 1, 2, 3, 4, 5};
  t = e.client->start_load(r);
  REQUIRE(t);
  CHECK(e.client->wait_for_layer(*t, layers) == caf::sec::invalid_argument);
  CHECK(e.client->wait(*t));
  std::vector<std::byte> more(geometry().layer_bytes());
  CHECK(e.client->register_kv({{more.data(), more.size()}})
        == caf::sec::invalid_argument); // once per client
  save_request s;
  s.tokens = prompt(2);
  s.first_block = 1;
  s.pages = {0, 1}; // blocks 1..2 of a prompt of 2 full blocks
  CHECK(!e.client->start_save(s));
  auto lr = e.client->lookup_result(999);
  REQUIRE(lr);
  CHECK(!*lr);
  client_config bad;
  bad.store_dir = e.dir.path();
  CHECK(!kv_client::make(bad)); // no geometry
}

namespace {

// Policy and niceness of this process's threads named `comm`: a reader's
// I/O threads are named and in their class when its spawn returns (the
// client's make() has returned), so no wait.
std::vector<std::pair<int, int>> threads_named(const std::string& comm) {
  return test::threads_now(comm);
}

} // namespace

TEST_CASE("the client's storage I/O threads run in the normal CPU class") {
  // In an engine's process whose compute threads fill every core, KV I/O
  // threads at SCHED_IDLE (a node process's default) would starve.
  test::temp_dir dir{"dp-client-sched"};
  client_config cfg;
  cfg.store_dir = dir.path();
  cfg.geometry = geometry();
  cfg.buffer_blocks = 4;
  {
    auto c = kv_client::make(cfg);
    REQUIRE(c);
    auto io = threads_named("dp-kv-io");
    REQUIRE(!io.empty());
    for (auto& [policy, nice] : io) {
      CHECK(policy == SCHED_OTHER);
      CHECK(nice == 0);
    }
  }
  // The class is the client's setting: idle when asked for.
  cfg.kv_thread_sched = transport::bulk::tcp_cpu_sched::idle;
  {
    auto c = kv_client::make(cfg);
    REQUIRE(c);
    auto io = threads_named("dp-kv-io");
    REQUIRE(!io.empty());
    for (auto& [policy, nice] : io)
      CHECK(policy == SCHED_IDLE);
  }
  // Out of range: refused naming the field.
  cfg.kv_thread_sched = transport::bulk::tcp_cpu_sched::normal;
  cfg.kv_thread_nice = 20;
  auto bad = kv_client::make(cfg);
  REQUIRE(!bad);
  CHECK(bad.error() == caf::sec::invalid_argument);
  CHECK(actors::render(bad.error()).find("kv_thread_nice")
        != std::string::npos);
}
