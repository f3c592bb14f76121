// ctest-label: foundation
// A token_sequence's prefixes are shared, immutable token_lists: they keep
// their ids when the sequence grows or moves to a bigger buffer, and their
// cached block hashes equal hashing the ids afresh.
#include <doctest/doctest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "actors/protocol/token_list.hpp"
#include "scheduler/workload/trajectory.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors;
namespace workload = dualpath::scheduler::workload;
namespace storage = dualpath::transport::storage;

namespace {

std::vector<uint32_t> iota_ids(uint32_t first, size_t n) {
  std::vector<uint32_t> out(n);
  for (size_t k = 0; k < n; ++k)
    out[k] = first + static_cast<uint32_t>(k) * 2654435761u;
  return out;
}

workload::trajectory agent(uint64_t id, size_t turns) {
  workload::trajectory t;
  t.agent = id;
  t.seed = 77;
  for (size_t i = 0; i < turns; ++i)
    t.turns.push_back(workload::turn{static_cast<uint32_t>(300 + 37 * i),
                                     static_cast<uint32_t>(50 + 11 * i)});
  return t;
}

} // namespace

TEST_CASE("prefixes keep their ids while the sequence grows and moves") {
  token_sequence seq;
  auto first = iota_ids(1, 1000);
  seq.append(first.data(), first.size());
  auto a = seq.prefix(700);
  auto b = seq.prefix(1000);
  CHECK(a.shares_with(b));
  // Far past any capacity the first append reserved: a move.
  auto more = iota_ids(5, 100'000);
  seq.append(more.data(), more.size());
  auto c = seq.prefix(101'000);
  CHECK_FALSE(c.shares_with(a));
  CHECK_EQ(a.size(), 700u);
  CHECK(a.to_vector()
        == std::vector<uint32_t>(first.begin(), first.begin() + 700));
  CHECK(b.to_vector() == first);
  auto all = first;
  all.insert(all.end(), more.begin(), more.end());
  CHECK(c.to_vector() == all);
  CHECK(c == token_list{all});
  CHECK(seq.prefix(0).empty());
  CHECK_EQ(seq.prefix(1'000'000).size(), all.size()); // clamped to size()
}

TEST_CASE("a moved-from list is empty; the moved-to one keeps the view") {
  token_sequence seq;
  auto ids = iota_ids(3, 500);
  seq.append(ids.data(), ids.size());
  auto a = seq.prefix(300);
  auto b = std::move(a);
  CHECK(a.empty()); // NOLINT(bugprone-use-after-move): the state is the test
  CHECK(a.block_hashes(64).empty());
  CHECK(a == token_list{});
  CHECK(b.to_vector() == std::vector<uint32_t>(ids.begin(), ids.begin() + 300));
  token_list c;
  c = std::move(b);
  CHECK(b.empty()); // NOLINT(bugprone-use-after-move)
  CHECK_EQ(c.size(), 300u);
  CHECK(c.block_hashes(64)
        == storage::block_hashes(
            std::vector<uint32_t>(ids.begin(), ids.begin() + 300), 64));
}

TEST_CASE("cached block hashes equal hashing the ids, per block size") {
  token_sequence seq;
  std::vector<uint32_t> all;
  for (uint32_t round = 0; round < 6; ++round) {
    // Uneven appends: partial blocks at every prefix end; a move midway.
    auto ids = iota_ids(round * 1000, 130 + round * 9000);
    seq.append(ids.data(), ids.size());
    all.insert(all.end(), ids.begin(), ids.end());
    for (size_t len :
         {size_t{0}, size_t{63}, size_t{64}, all.size() / 2, all.size()}) {
      auto view = seq.prefix(len);
      std::vector<uint32_t> ref(all.begin(), all.begin() + len);
      CHECK(view.block_hashes(64) == storage::block_hashes(ref, 64));
      // Another block size on the same buffer is computed apart (not cached).
      CHECK(view.block_hashes(16) == storage::block_hashes(ref, 16));
      CHECK(view.block_hashes(64) == storage::block_hashes(ref, 64));
    }
  }
  CHECK(token_list{}.block_hashes(64).empty());
  CHECK(token_list{1, 2, 3}.block_hashes(0).empty());
  // A plain list (not from a sequence) hashes the same.
  CHECK(token_list{all}.block_hashes(64) == storage::block_hashes(all, 64));
}

TEST_CASE("views of one buffer hash concurrently to the same result") {
  token_sequence seq;
  auto ids = iota_ids(9, 200'000);
  seq.append(ids.data(), ids.size());
  auto expect = storage::block_hashes(ids, 64);
  std::vector<std::vector<transport::block_hash>> got(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k)
    threads.emplace_back([&, k] {
      // Different lengths extend the shared chain from different threads.
      got[k] = seq.prefix(ids.size() - k * 5000).block_hashes(64);
    });
  for (auto& t : threads)
    t.join();
  for (size_t k = 0; k < got.size(); ++k) {
    REQUIRE_EQ(got[k].size(), (ids.size() - k * 5000) / 64);
    CHECK(std::equal(got[k].begin(), got[k].end(), expect.begin()));
  }
}

TEST_CASE("a sequence extended turn by turn yields each turn's prompt") {
  // What the replay does: one sequence per agent, each prompt a prefix.
  for (uint64_t id : {1u, 2u}) {
    auto traj = agent(id, 12);
    token_sequence seq;
    for (size_t turn = 0; turn < traj.turns.size(); ++turn) {
      auto len = workload::prompt_length(traj, turn);
      auto n = len - seq.size();
      workload::tokens_into(traj, seq.size(), n, seq.extend(n));
      seq.commit(n);
      auto prompt = seq.prefix(len);
      CHECK(prompt.to_vector() == workload::prompt_tokens(traj, turn));
      CHECK(prompt.block_hashes(64)
            == storage::block_hashes(workload::prompt_tokens(traj, turn), 64));
    }
  }
}

TEST_CASE("a hash span stays valid and unchanged while the sequence grows") {
  token_sequence seq;
  auto first = iota_ids(0, 64 * 3 + 5);
  seq.append(first.data(), first.size());
  auto view = seq.prefix(first.size());
  auto span = view.block_hash_span(64);
  REQUIRE_EQ(span.size, 3u);
  auto ref = storage::block_hashes(first, 64);
  CHECK(std::equal(span.begin(), span.end(), ref.begin(), ref.end()));
  auto* before = span.data();
  // Appends within the capacity extend the cache in place; one far past it
  // moves the sequence to a new buffer: the span keeps the old one alive.
  for (uint32_t round = 0; round < 20; ++round) {
    auto more = iota_ids(100000 + round * 1000, 700 + round * 300);
    seq.append(more.data(), more.size());
    auto longer = seq.prefix(seq.size());
    auto s2 = longer.block_hash_span(64);
    CHECK_EQ(s2.size, seq.size() / 64);
  }
  view = token_list{};
  CHECK_EQ(span.data(), before);
  CHECK(std::equal(span.begin(), span.end(), ref.begin(), ref.end()));
  // Another block size: a list of its own, equal to hashing the ids.
  auto again = seq.prefix(first.size());
  auto s16 = again.block_hash_span(16);
  auto ref16 = storage::block_hashes(first, 16);
  CHECK(std::equal(s16.begin(), s16.end(), ref16.begin(), ref16.end()));
  CHECK(token_list{}.block_hash_span(64).size == 0);
}
