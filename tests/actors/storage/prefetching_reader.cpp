// ctest-label: observability
// The extension example (docs/extending.md): the prefetching reader learns
// an agent's chain from a read and the persists of its turn, reads the
// chain's tail ahead once the persists settle, serves the next turn's read
// from the kept leases (byte-exact, in block order, others read as usual),
// and reports its own metrics to an observer.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/protocol/register.hpp"
#include "actors/storage/prefetching_reader.hpp"
#include "actors/storage/storage_reader.hpp"
#include "tests/actors/actor_config.hpp"
#include "tests/actors/observe/forwarder.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace dualpath::transport::storage;

namespace {

constexpr auto timeout = std::chrono::seconds(10);

} // namespace

TEST_CASE("the next turn's blocks are prefetched and served from DRAM") {
  test::temp_dir dir{"dp-prefetch"};
  kv_geometry geo{4, 8, 100};
  auto store = test::open_store(dir, geo, 8);
  // Turn 1's prompt: 2 blocks in storage; turn 2's prompt adds 2 more,
  // persisted by the decode engine at the end of turn 1.
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 4 * geo.block_tokens; ++i)
    tokens.push_back(1000 + i);
  auto hashes = block_hashes(tokens, geo.block_tokens);
  REQUIRE(hashes.size() == 4);
  REQUIRE(populate(
      *store, {std::vector<uint32_t>(tokens.begin(),
                                     tokens.begin() + 2 * geo.block_tokens)}));
  test::actor_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto file = geo.file_bytes();
  auto pool = buffer_pool::make(32 * file, file);
  REQUIRE(pool);
  storage_reader_config rc;
  rc.node = "de0";
  rc.store = store;
  rc.pool = *pool;
  rc.io_threads = 1;
  auto inner = spawn_storage_reader(sys, rc);
  REQUIRE(inner);
  auto obs =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), false);
  prefetch_config pc;
  pc.node = "de0";
  pc.observer = obs;
  pc.report_period = std::chrono::milliseconds(20);
  // Longer than the two persists below take even under a sanitizer (each is
  // a real file write): with the default 2 ms the chain could settle after
  // the first one and be prefetched twice (7 blocks instead of 4).
  pc.settle = std::chrono::milliseconds(500);
  auto reader = spawn_prefetching_reader(sys, *inner, pc);
  auto read = [&](uint32_t first, uint32_t n) {
    read_request r;
    r.request_id = 1;
    r.first_block = first;
    r.blocks.assign(hashes.begin() + first, hashes.begin() + first + n);
    r.tokens = n * geo.block_tokens;
    read_completion out;
    self->request(reader, timeout, read_atom_v, r)
        .receive([&](read_completion& c) { out = std::move(c); },
                 [&](caf::error& err) { FAIL(caf::to_string(err)); });
    return out;
  };
  auto release = [&](const read_completion& c) {
    for (auto& l : c.leases)
      self->send(reader, release_atom_v, l.lease_id);
  };
  // Turn 1 reads its 2 blocks (the reader learns the chain) ...
  auto turn1 = read(0, 2);
  REQUIRE(turn1.leases.size() == 2);
  release(turn1);
  // ... and its decode engine persists blocks 2 and 3.
  for (uint32_t b = 2; b < 4; ++b) {
    block_hash got = 0;
    self->request(
            reader, timeout, persist_atom_v,
            persist_request{hashes[b], hashes[b - 1], geo.block_tokens, {}})
        .receive([&](block_hash h) { got = h; },
                 [&](caf::error& err) { FAIL(caf::to_string(err)); });
    CHECK(got == hashes[b]);
  }
  // While the tool call runs, the chain's tail is read ahead.
  state_snapshot last;
  auto value = [&](const std::string& name) {
    for (auto& s : last.samples)
      if (s.name == name)
        return s.value;
    return -1.0;
  };
  for (int i = 0; i < 200 && value("dualpath_prefetch_blocks_total") < 4; ++i)
    self->receive([&](snapshot_atom, const state_snapshot& s) { last = s; },
                  caf::after(timeout) >> [&] { i = 200; });
  CHECK(last.source == "prefetch.de0");
  CHECK(value("dualpath_prefetch_blocks_total") == 4);
  CHECK(value("dualpath_prefetch_kept_blocks") == 4);
  // Turn 2's read: every block from the kept leases, byte-exact, in order.
  auto turn2 = read(0, 4);
  REQUIRE(turn2.leases.size() == 4);
  CHECK(turn2.failed.empty());
  for (uint32_t b = 0; b < 4; ++b) {
    CHECK(turn2.leases[b].block_index == b);
    CHECK(turn2.leases[b].hash == hashes[b]);
    CHECK(test::layers_exact(turn2.leases[b], **pool, geo));
  }
  release(turn2);
  for (int i = 0; i < 200 && value("dualpath_prefetch_hits_total") < 4; ++i)
    self->receive([&](snapshot_atom, const state_snapshot& s) { last = s; },
                  caf::after(timeout) >> [&] { i = 200; });
  CHECK(value("dualpath_prefetch_hits_total") == 4);
  CHECK(value("dualpath_prefetch_kept_blocks") == 0);
  // A block nobody prefetched is read as usual.
  auto again = read(1, 2);
  CHECK(again.leases.size() == 2);
  release(again);
  self->send_exit(reader, caf::exit_reason::user_shutdown);
  self->send_exit(obs, caf::exit_reason::user_shutdown);
}
