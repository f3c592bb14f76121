// ctest-label: storage
// The KV block format, the prefix index and both storage backends against
// real files: Full and Layer Block write/read/verify, byte-exact deterministic
// content, longest-hit lookup over divergent prefixes, index rebuild after a
// restart, concurrent writers of one block, and pre-population for a trace.
#include <doctest/doctest.h>

#include <filesystem>
#include <thread>

#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::storage;

namespace {

// Small geometry: 4 layers x 8 tokens x 100 bytes. 800-byte Layer Blocks are
// not 4 KiB multiples, which exercises unaligned layer ranges under O_DIRECT.
kv_geometry small_geo() {
  return kv_geometry{4, 8, 100};
}

std::vector<uint32_t> seq(uint32_t start, size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = start + static_cast<uint32_t>(i);
  return v;
}

std::unique_ptr<block_store> open_store(const std::string& dir,
                                        backend_kind kind, io_mode mode,
                                        const std::string& model = "m1") {
  auto backend = make_backend(backend_config{kind, 8});
  REQUIRE(backend);
  auto store = block_store::open(
      store_config{dir, model, small_geo(), mode, durability::none}, *backend);
  REQUIRE(store);
  return std::move(*store);
}

} // namespace

TEST_CASE("block hashes chain over the prefix") {
  auto a = seq(0, 24);
  auto b = a;
  b[10] = 999; // diverges in the second block
  auto ha = block_hashes(a, 8);
  auto hb = block_hashes(b, 8);
  REQUIRE_EQ(ha.size(), 3u);
  CHECK_EQ(ha[0], hb[0]);
  CHECK_NE(ha[1], hb[1]);
  // The third blocks hold equal tokens but different prefixes.
  CHECK_NE(ha[2], hb[2]);
  CHECK_EQ(ha[0], chain_hash(root_hash, a.data(), 8));
  CHECK_EQ(ha[1], chain_hash(ha[0], a.data() + 8, 8));
  // A trailing partial block has no hash.
  CHECK_EQ(block_hashes(seq(0, 23), 8).size(), 2u);
}

TEST_CASE("deterministic KV content depends on hash, layer and position") {
  std::vector<std::byte> x(100), y(100);
  kv_fill_token(42, 1, 3, x.data(), x.size());
  kv_fill_token(42, 1, 3, y.data(), y.size());
  CHECK(x == y);
  CHECK(kv_check_token(42, 1, 3, x.data(), x.size()));
  kv_fill_token(43, 1, 3, y.data(), y.size());
  CHECK(x != y);
  kv_fill_token(42, 2, 3, y.data(), y.size());
  CHECK(x != y);
  kv_fill_token(42, 1, 4, y.data(), y.size());
  CHECK(x != y);
  x[99] ^= std::byte{1}; // the last, partial word is checked too
  CHECK_FALSE(kv_check_token(42, 1, 3, x.data(), x.size()));
}

TEST_CASE("header encodes and decodes every field") {
  block_header hdr;
  hdr.model_id = "ds-660b";
  hdr.hash = 0x1122334455667788ull;
  hdr.parent = 7;
  hdr.tokens = 64;
  hdr.layers = 3;
  hdr.bytes_per_token_layer = 656;
  hdr.layer_checksums = {1, 2, 3};
  std::vector<std::byte> buf(header_bytes);
  REQUIRE_FALSE(encode_header(hdr, buf.data()));
  auto dec = decode_header(buf.data(), buf.size());
  REQUIRE(dec);
  CHECK_EQ(dec->version, format_version);
  CHECK_EQ(dec->model_id, hdr.model_id);
  CHECK_EQ(dec->hash, hdr.hash);
  CHECK_EQ(dec->parent, hdr.parent);
  CHECK_EQ(dec->tokens, 64u);
  CHECK_EQ(dec->layers, 3u);
  CHECK_EQ(dec->bytes_per_token_layer, 656u);
  CHECK(dec->layer_checksums == hdr.layer_checksums);
  hdr.version = 2;
  REQUIRE_FALSE(encode_header(hdr, buf.data()));
  CHECK_EQ(code_of(decode_header(buf.data(), buf.size()).error()),
           storage_errc::unknown_version);
}

TEST_CASE("Full and Layer Blocks write, read and verify on both backends") {
  for (auto kind : {backend_kind::io_uring, backend_kind::pread}) {
    for (auto mode : {io_mode::buffered, io_mode::direct}) {
      CAPTURE(to_string(kind));
      CAPTURE(to_string(mode));
      dualpath::test::temp_dir dir{"dp-store"};
      auto store = open_store(dir.path(), kind, mode);
      auto geo = store->geometry();
      auto tokens = seq(100, 24);
      auto hashes = block_hashes(tokens, geo.block_tokens);
      auto parent = root_hash;
      for (auto h : hashes) {
        REQUIRE_FALSE(store->write_generated(h, parent));
        parent = h;
      }
      CHECK_EQ(store->size(), 3u);
      auto buf = aligned_buffer::make(geo.file_bytes());
      REQUIRE(buf);
      for (auto h : hashes) {
        auto hdr = store->read_full(h, buf->data());
        REQUIRE(hdr);
        CHECK_EQ(hdr->hash, h);
        // The payload is the Full Block: Layer Blocks back to back, each
        // byte-exact.
        for (uint32_t l = 0; l < geo.layers; ++l)
          CHECK(kv_check_layer(
              h, l, geo.block_tokens, geo.bytes_per_token_layer,
              buf->data() + header_bytes + l * geo.layer_bytes()));
        std::vector<std::byte> layer(geo.layer_bytes());
        for (uint32_t l = 0; l < geo.layers; ++l) {
          REQUIRE_FALSE(store->read_layer(h, l, layer.data()));
          CHECK(kv_check_layer(h, l, geo.block_tokens,
                               geo.bytes_per_token_layer, layer.data()));
          // Concatenated Layer Blocks equal the Full Block.
          CHECK(std::equal(layer.begin(), layer.end(),
                           buf->data() + geo.layer_offset(l)));
        }
        CHECK_EQ(code_of(store->read_layer(h, geo.layers, layer.data())),
                 storage_errc::invalid_argument);
      }
    }
  }
}

TEST_CASE("lookup returns the longest stored prefix over divergent prompts") {
  dualpath::test::temp_dir dir{"dp-store"};
  auto store =
      open_store(dir.path(), backend_kind::automatic, io_mode::buffered);
  auto a = seq(0, 40); // 5 blocks
  auto b = a;
  b[20] = 12345; // diverges inside block 2
  auto stats = populate(*store, {a});
  REQUIRE(stats);
  CHECK_EQ(stats->written, 5u);
  // A second population finds everything present.
  auto again = populate(*store, {a});
  REQUIRE(again);
  CHECK_EQ(again->written, 0u);
  CHECK_EQ(again->present, 5u);
  auto ha = block_hashes(a, 8);
  auto hit = store->lookup(a);
  CHECK(hit.blocks == ha);
  CHECK_EQ(hit.hit_tokens, 40u);
  CHECK(std::filesystem::exists(store->path_of(ha[0])));
  // A longer prompt with a trailing partial block hits the 5 stored blocks.
  auto longer = a;
  for (uint32_t i = 0; i < 13; ++i)
    longer.push_back(7000 + i);
  CHECK_EQ(store->lookup(longer).blocks.size(), 5u);
  // The divergent prompt shares only blocks 0 and 1.
  auto hb = store->lookup(b);
  REQUIRE_EQ(hb.blocks.size(), 2u);
  CHECK_EQ(hb.hit_tokens, 16u);
  // Storing b's blocks makes b hit fully and leaves a unchanged.
  REQUIRE(populate(*store, {b}));
  CHECK_EQ(store->lookup(b).blocks.size(), 5u);
  CHECK_EQ(store->lookup(a).blocks.size(), 5u);
  // A gap ends the hit: a prompt whose first block is unknown hits nothing
  // even if later hashes were stored under another parent.
  auto c = seq(500, 16);
  CHECK(store->lookup(c).blocks.empty());
  // Storing only block 1 of c (not block 0) still gives no hit.
  auto hc = block_hashes(c, 8);
  REQUIRE_FALSE(store->write_generated(hc[1], hc[0]));
  CHECK(store->lookup(c).blocks.empty());
}

TEST_CASE("the index rebuilds from the directory after a restart") {
  dualpath::test::temp_dir dir{"dp-store"};
  auto a = seq(0, 32);
  auto b = seq(1000, 16);
  {
    auto store =
        open_store(dir.path(), backend_kind::automatic, io_mode::buffered);
    REQUIRE(populate(*store, {a, b}));
    CHECK_EQ(store->size(), 6u);
    // Litter of an interrupted write and a foreign file are ignored.
    auto some = store->path_of(block_hashes(a, 8)[0]);
    dualpath::test::write_file(some + ".tmp.1.2", "x");
  }
  dualpath::test::write_file(dir.path() + "/README", "x");
  auto store = open_store(dir.path(), backend_kind::pread, io_mode::direct);
  CHECK_EQ(store->size(), 6u);
  CHECK_EQ(store->scan().blocks, 6u);
  CHECK_EQ(store->lookup(a).blocks.size(), 4u);
  CHECK_EQ(store->lookup(b).blocks.size(), 2u);
  // A store of another model sees none of them (rejected, not indexed).
  auto other = open_store(dir.path(), backend_kind::pread, io_mode::buffered,
                          "other-model");
  CHECK_EQ(other->size(), 0u);
  CHECK_EQ(other->scan().rejected, 6u);
}

TEST_CASE("concurrent writers of the same block stay correct") {
  dualpath::test::temp_dir dir{"dp-store"};
  auto store =
      open_store(dir.path(), backend_kind::automatic, io_mode::buffered);
  auto tokens = seq(0, 8);
  auto h = block_hashes(tokens, 8)[0];
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int i = 0; i < 4; ++i)
    writers.emplace_back([&] {
      for (int k = 0; k < 10; ++k)
        if (store->write_generated(h, root_hash))
          ++failures;
    });
  // Readers running meanwhile see the old or the new (equal) file, never a
  // partial one.
  auto buf = aligned_buffer::make(store->geometry().file_bytes());
  REQUIRE(buf);
  int read_errors = 0;
  for (int k = 0; k < 20; ++k) {
    if (store->contains(h) && !store->read_full(h, buf->data()))
      ++read_errors;
  }
  for (auto& w : writers)
    w.join();
  CHECK_EQ(failures.load(), 0);
  CHECK_EQ(read_errors, 0);
  CHECK_EQ(store->size(), 1u);
  auto names = store->backend().list(
      dir.path() + "/" + store->path_of(h).substr(dir.path().size() + 1, 2));
  REQUIRE(names);
  CHECK_EQ(names->size(), 1u); // no temporary file left behind
  CHECK(store->read_full(h, buf->data()));
}

TEST_CASE("concurrent readers each get a ring (io_uring) or a worker") {
  for (auto kind : {backend_kind::io_uring, backend_kind::pread}) {
    CAPTURE(to_string(kind));
    dualpath::test::temp_dir dir{"dp-store"};
    auto store = open_store(dir.path(), kind, io_mode::direct);
    auto tokens = seq(0, 64);
    REQUIRE(populate(*store, {tokens}));
    auto hashes = block_hashes(tokens, 8);
    std::atomic<int> bad{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 4; ++t)
      readers.emplace_back([&] {
        auto geo = store->geometry();
        std::vector<aligned_buffer> bufs;
        std::vector<std::byte*> ptrs;
        for (size_t i = 0; i < hashes.size(); ++i) {
          bufs.push_back(std::move(*aligned_buffer::make(geo.file_bytes())));
          ptrs.push_back(bufs.back().data());
        }
        for (int k = 0; k < 10; ++k) {
          auto errs = store->read_full_batch(hashes, ptrs);
          for (size_t i = 0; i < errs.size(); ++i)
            if (errs[i]
                || !kv_check_layer(hashes[i], 3, geo.block_tokens,
                                   geo.bytes_per_token_layer,
                                   ptrs[i] + geo.layer_offset(3)))
              ++bad;
        }
      });
    for (auto& r : readers)
      r.join();
    CHECK_EQ(bad.load(), 0);
  }
}
