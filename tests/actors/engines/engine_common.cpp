// ctest-label: engines
// ctest-links: actors_storage
// What the engines share: a storage read through read_blocks yields the
// reader's completion when it answers, and every block as failed (a miss to
// recompute) when the reader fails as a whole; one GPU's load report; the
// byte units of an engine's model; each mode's read plan.
#include <doctest/doctest.h>

#include <future>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/engines/engine_common.hpp"
#include "actors/protocol/register.hpp"
#include "actors/storage/storage_reader.hpp"
#include "tests/actors/actor_config.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace dualpath::transport::storage;

namespace {

// Reads `rr` through read_blocks from an actor and returns the completion.
read_completion read_via(caf::actor_system& sys,
                         const storage_reader_actor& reader, read_request rr) {
  auto done = std::make_shared<std::promise<read_completion>>();
  auto fut = done->get_future();
  sys.spawn([reader, rr, done](caf::event_based_actor* self) mutable {
    read_blocks(self, reader, std::move(rr),
                [done](read_completion c) { done->set_value(std::move(c)); });
  });
  REQUIRE(fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return fut.get();
}

} // namespace

TEST_CASE("read_blocks: the reader's answer, or every block failed") {
  test::temp_dir dir{"dp-common"};
  kv_geometry geo{2, 16, 8};
  auto shared = test::open_store(dir, geo, 4);
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 3 * geo.block_tokens; ++i)
    prompt.push_back(1000 + i);
  REQUIRE(populate(*shared, {prompt}));
  auto pool = buffer_pool::make(4 * geo.file_bytes(), geo.file_bytes());
  REQUIRE(pool);
  test::actor_config cfg;
  caf::actor_system sys{cfg};
  storage_reader_config rc;
  rc.node = "n0";
  rc.store = shared;
  rc.pool = *pool;
  rc.io_threads = 1;
  auto reader = spawn_storage_reader(sys, rc);
  REQUIRE(reader);
  read_request rr;
  rr.request_id = 7;
  rr.blocks = block_hashes(prompt, geo.block_tokens);
  rr.tokens = 3 * geo.block_tokens;
  auto ok = read_via(sys, *reader, rr);
  CHECK_EQ(ok.request_id, 7u);
  CHECK_EQ(ok.leases.size(), 3u);
  CHECK(ok.failed.empty());
  std::vector<uint64_t> ids;
  for (auto& l : ok.leases)
    ids.push_back(l.lease_id);
  caf::anon_send(*reader, release_atom_v, lease_release{ids});
  // The reader is gone: the read fails as a whole, every block a miss.
  caf::scoped_actor self{sys};
  self->send_exit(*reader, caf::exit_reason::user_shutdown);
  self->wait_for(*reader);
  auto gone = read_via(sys, *reader, rr);
  CHECK_EQ(gone.request_id, 7u);
  CHECK(gone.leases.empty());
  CHECK(gone.failed == rr.blocks);
}

TEST_CASE("one GPU's load: its rank on the node, the node's read queue") {
  engine_config c;
  c.role = engine_role::decode;
  c.node = std::make_shared<node_resources>();
  c.node->name = "de3";
  CHECK_EQ(read_queue_of(c).tokens, 0u); // no board: nothing published
  c.node->loads = std::make_shared<load_board>();
  c.node->loads->publish_read_queue(read_queue_status{640, 65536, 2});
  auto x = lane_load(c, 5, 2, 900, 1234);
  CHECK(x.engine == engine_id{"de3", engine_role::decode, 5});
  CHECK_EQ(x.seq, 2u);
  CHECK_EQ(x.tok, 900u);
  CHECK_EQ(x.free_hbm_bytes, 1234u);
  auto q = read_queue_of(c);
  CHECK_EQ(q.tokens, 640u);
  CHECK_EQ(q.bytes, 65536u);
  CHECK_EQ(q.requests, 2u);
}

TEST_CASE("byte units and the modes that move KV") {
  engine_config c;
  c.model.real_bytes_per_token_layer = 24;
  CHECK_EQ(bpt(c), 24u);
  for (auto m : {load_mode::basic, load_mode::layerwise, load_mode::dualpath}) {
    c.mode = m;
    CHECK(moves_bytes(c));
    c.real_bytes = false;
    CHECK_FALSE(copies_bytes(c));
    c.real_bytes = true;
    CHECK(copies_bytes(c));
  }
  c.mode = load_mode::oracle;
  CHECK_FALSE(moves_bytes(c));
  CHECK_FALSE(copies_bytes(c));
}

TEST_CASE("each mode applies its own read plan") {
  read_plan scheduled{5, 2};
  auto basic = plan_for(load_mode::basic, scheduled, 10);
  CHECK_EQ(basic.hit_blocks, 5u);
  CHECK_EQ(basic.pe_side_blocks, 5u);
  auto layerwise = plan_for(load_mode::layerwise, scheduled, 10);
  CHECK_EQ(layerwise.pe_side_blocks, 5u);
  auto dual = plan_for(load_mode::dualpath, scheduled, 10);
  CHECK_EQ(dual.hit_blocks, 5u);
  CHECK_EQ(dual.pe_side_blocks, 2u);
  auto oracle = plan_for(load_mode::oracle, scheduled, 10);
  CHECK_EQ(oracle.pe_side_blocks, 0u);
  // Hits never exceed the prompt's full blocks, nor PE-side the hits.
  auto clamped = plan_for(load_mode::dualpath, read_plan{9, 12}, 3);
  CHECK_EQ(clamped.hit_blocks, 3u);
  CHECK_EQ(clamped.pe_side_blocks, 3u);
}
