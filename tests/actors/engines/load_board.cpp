// ctest-label: engines
// The load board: the last published load of each engine, in rank order,
// completed with the node's read queue; the asking engine and engines that
// never published are left out; later publications replace earlier ones.
#include <doctest/doctest.h>

#include "actors/engines/load_board.hpp"

using namespace dualpath::actors;

namespace {

engine_load load(uint32_t rank, uint32_t seq, uint64_t tok) {
  engine_load x;
  x.engine = engine_id{"n0", engine_role::decode, rank};
  x.seq = seq;
  x.tok = tok;
  x.read_q_tokens = 999; // ignored: the reader's numbers count
  x.free_hbm_bytes = 1000 + rank;
  return x;
}

} // namespace

TEST_CASE("the board answers what each engine published last") {
  load_board b;
  CHECK(b.others(0).empty());
  b.publish(load(3, 1, 100));
  b.publish(load(1, 2, 200));
  b.publish(load(0, 5, 500));
  b.publish_read_queue(read_queue_status{640, 65536, 2});
  auto xs = b.others(0);
  REQUIRE_EQ(xs.size(), 2u);
  CHECK_EQ(xs[0].engine.rank, 1u);
  CHECK_EQ(xs[0].seq, 2u);
  CHECK_EQ(xs[0].tok, 200u);
  CHECK_EQ(xs[0].free_hbm_bytes, 1001u);
  CHECK_EQ(xs[1].engine.rank, 3u);
  for (auto& x : xs) {
    CHECK_EQ(x.read_q_tokens, 640u);
    CHECK_EQ(x.read_q_bytes, 65536u);
  }
  b.publish(load(1, 0, 0));
  b.publish_read_queue(read_queue_status{});
  xs = b.others(3);
  REQUIRE_EQ(xs.size(), 2u);
  CHECK_EQ(xs[0].engine.rank, 0u);
  CHECK_EQ(xs[1].engine.rank, 1u);
  CHECK_EQ(xs[1].seq, 0u);
  CHECK_EQ(xs[1].read_q_tokens, 0u);
  CHECK_EQ(b.read_queue().requests, 0u);
}
