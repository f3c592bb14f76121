// ctest-label: storage
// Every bad-input case of the block store, driven through the fault-injecting
// backend decorator (and, where cheap, the real file system as well): each is
// a typed storage_errc, nothing crashes and no unverified byte is accepted.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <functional>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/support/support.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/faulty_backend.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath::transport;
using namespace dualpath::transport::storage;

namespace {

struct fixture {
  dualpath::test::temp_dir dir{"dp-faults"};
  std::shared_ptr<faulty_backend> faulty;
  std::unique_ptr<block_store> store;
  std::vector<uint32_t> tokens;
  std::vector<block_hash> hashes;
  aligned_buffer buf;

  fixture() {
    auto inner = make_backend(backend_config{backend_kind::automatic, 4});
    REQUIRE(inner);
    faulty = std::make_shared<faulty_backend>(*inner);
    store = open("m1");
    for (uint32_t i = 0; i < 24; ++i)
      tokens.push_back(i * 7);
    REQUIRE(populate(*store, {tokens}));
    hashes = block_hashes(tokens, 8);
    buf = std::move(*aligned_buffer::make(store->geometry().file_bytes()));
  }

  std::unique_ptr<block_store> open(const std::string& model) {
    auto s = block_store::open(
        store_config{dir.path(), model, kv_geometry{4, 8, 100}}, faulty);
    REQUIRE(s);
    return std::move(*s);
  }

  storage_errc read_full(block_hash h) {
    return read_full(*store, h);
  }

  storage_errc read_full(block_store& s, block_hash h) {
    auto r = s.read_full(h, buf.data());
    return r ? storage_errc::none : code_of(r.error());
  }

  storage_errc read_layer(block_hash h, uint32_t layer) {
    std::vector<std::byte> dst(store->geometry().layer_bytes());
    return code_of(store->read_layer(h, layer, dst.data()));
  }
};

} // namespace

TEST_CASE("a clean store reads without error") {
  fixture f;
  for (auto h : f.hashes) {
    CHECK_EQ(f.read_full(h), storage_errc::none);
    CHECK_EQ(f.read_layer(h, 3), storage_errc::none);
  }
  CHECK_EQ(f.faulty->injected(), 0u);
}

TEST_CASE("missing block") {
  fixture f;
  CHECK_EQ(f.read_full(0xdeadbeef), storage_errc::missing_block);
  CHECK_EQ(f.read_layer(0xdeadbeef, 0), storage_errc::missing_block);
  // Deleted behind the index's back: still a typed error, not a crash.
  REQUIRE_EQ(::unlink(f.store->path_of(f.hashes[1]).c_str()), 0);
  CHECK_EQ(f.read_full(f.hashes[1]), storage_errc::missing_block);
}

TEST_CASE("truncated file") {
  fixture f;
  auto geo = f.store->geometry();
  // Injected: the file ends inside layer 2.
  fault_plan plan;
  plan.truncate_at = static_cast<int64_t>(geo.layer_offset(2) + 10);
  f.faulty->set_plan(plan);
  CHECK_EQ(f.read_full(f.hashes[0]), storage_errc::truncated);
  CHECK_EQ(f.read_layer(f.hashes[0], 2), storage_errc::truncated);
  CHECK_EQ(f.read_layer(f.hashes[0], 1), storage_errc::none);
  // Injected: the file ends inside the header.
  plan.truncate_at = 6;
  f.faulty->set_plan(plan);
  CHECK_EQ(f.read_full(f.hashes[0]), storage_errc::truncated);
  CHECK_GT(f.faulty->injected(), 0u);
  // Real: truncate(2) the file.
  f.faulty->set_plan({});
  auto path = f.store->path_of(f.hashes[2]);
  REQUIRE_EQ(::truncate(path.c_str(), static_cast<off_t>(header_bytes + 50)),
             0);
  CHECK_EQ(f.read_full(f.hashes[2]), storage_errc::truncated);
}

TEST_CASE("header checksum mismatch") {
  fixture f;
  fault_plan plan;
  plan.corrupt_offset = 20; // inside the msgpack body
  f.faulty->set_plan(plan);
  CHECK_EQ(f.read_full(f.hashes[0]), storage_errc::header_checksum);
  CHECK_EQ(f.read_layer(f.hashes[0], 0), storage_errc::header_checksum);
  plan.corrupt_offset = 1; // the length field
  f.faulty->set_plan(plan);
  CHECK_EQ(f.read_full(f.hashes[0]), storage_errc::header_checksum);
  // The index rebuild skips blocks with a corrupt header.
  plan.corrupt_offset = 20;
  f.faulty->set_plan(plan);
  auto reopened = f.open("m1");
  CHECK_EQ(reopened->size(), 0u);
  CHECK_EQ(reopened->scan().rejected, 3u);
}

TEST_CASE("layer checksum mismatch") {
  fixture f;
  auto geo = f.store->geometry();
  fault_plan plan;
  plan.path_filter = f.store->path_of(f.hashes[1]);
  plan.corrupt_offset = static_cast<int64_t>(geo.layer_offset(2) + 77);
  f.faulty->set_plan(plan);
  CHECK_EQ(f.read_full(f.hashes[1]), storage_errc::layer_checksum);
  CHECK_EQ(f.read_layer(f.hashes[1], 2), storage_errc::layer_checksum);
  // Other layers of the same block verify on their own.
  CHECK_EQ(f.read_layer(f.hashes[1], 1), storage_errc::none);
  CHECK_EQ(f.read_layer(f.hashes[1], 3), storage_errc::none);
  // Other blocks are untouched by the filtered plan.
  CHECK_EQ(f.read_full(f.hashes[0]), storage_errc::none);
  // A batch fails only the corrupt block.
  auto b2 = aligned_buffer::make(geo.file_bytes());
  REQUIRE(b2);
  auto errs = f.store->read_full_batch({f.hashes[0], f.hashes[1]},
                                       {f.buf.data(), b2->data()});
  CHECK_EQ(code_of(errs[0]), storage_errc::none);
  CHECK_EQ(code_of(errs[1]), storage_errc::layer_checksum);
}

TEST_CASE("unknown format version") {
  fixture f;
  auto geo = f.store->geometry();
  // A block written by a future version: valid checksum, version 2.
  auto h = f.hashes[0];
  REQUIRE_FALSE(make_block(geo, "m1", h, root_hash, f.buf.data()));
  auto hdr = decode_header(f.buf.data(), header_bytes);
  REQUIRE(hdr);
  hdr->version = format_version + 1;
  REQUIRE_FALSE(encode_header(*hdr, f.buf.data()));
  REQUIRE_FALSE(f.faulty->write_atomic(f.store->path_of(h), f.buf.data(),
                                       geo.file_bytes(), durability::none));
  CHECK_EQ(f.read_full(h), storage_errc::unknown_version);
  CHECK_EQ(f.read_layer(h, 0), storage_errc::unknown_version);
  CHECK_EQ(f.open("m1")->scan().rejected, 1u);
}

TEST_CASE("wrong model id") {
  fixture f;
  auto other = f.open("another-model");
  CHECK_EQ(other->size(), 0u);
  CHECK_EQ(f.read_full(*other, f.hashes[0]), storage_errc::wrong_model);
  // Same model id, different KV geometry: also the wrong model.
  auto geo2 = block_store::open(
      store_config{f.dir.path(), "m1", kv_geometry{4, 8, 200}}, f.faulty);
  REQUIRE(geo2);
  auto big = aligned_buffer::make((*geo2)->geometry().file_bytes());
  REQUIRE(big);
  auto r = (*geo2)->read_full(f.hashes[0], big->data());
  REQUIRE_FALSE(r);
  CHECK_EQ(code_of(r.error()), storage_errc::wrong_model);
}

TEST_CASE("unreadable directory") {
  fixture f;
  fault_plan plan;
  plan.unreadable_directories = true;
  f.faulty->set_plan(plan);
  auto s = block_store::open(
      store_config{f.dir.path(), "m1", kv_geometry{4, 8, 100}}, f.faulty);
  REQUIRE_FALSE(s);
  CHECK_EQ(code_of(s.error()), storage_errc::unreadable_directory);
  // Real: a "directory" below a regular file.
  f.faulty->set_plan({});
  auto file = f.dir.file("plain");
  dualpath::test::write_file(file, "x");
  auto t = block_store::open(
      store_config{file + "/store", "m1", kv_geometry{4, 8, 100}}, f.faulty);
  REQUIRE_FALSE(t);
  CHECK_EQ(code_of(t.error()), storage_errc::unreadable_directory);
}

TEST_CASE("disk full on write") {
  fixture f;
  fault_plan plan;
  plan.disk_full = true;
  f.faulty->set_plan(plan);
  std::vector<uint32_t> fresh(8, 4242);
  auto h = block_hashes(fresh, 8)[0];
  CHECK_EQ(code_of(f.store->write_generated(h, root_hash)),
           storage_errc::disk_full);
  // Not indexed, no file, no hit.
  CHECK_FALSE(f.store->contains(h));
  CHECK(f.store->lookup(fresh).blocks.empty());
  CHECK_EQ(access(f.store->path_of(h).c_str(), F_OK), -1);
  auto pop = populate(*f.store, {fresh});
  REQUIRE_FALSE(pop);
  CHECK_EQ(code_of(pop.error()), storage_errc::disk_full);
  // Space again: the write succeeds.
  f.faulty->set_plan({});
  CHECK_EQ(code_of(f.store->write_generated(h, root_hash)), storage_errc::none);
  CHECK(f.store->contains(h));
}

TEST_CASE("fail after N and delay") {
  fixture f;
  fault_plan plan;
  plan.fail_after = 2;
  plan.delay = std::chrono::milliseconds{20};
  f.faulty->set_plan(plan);
  auto b1 = aligned_buffer::make(f.store->geometry().file_bytes());
  auto b2 = aligned_buffer::make(f.store->geometry().file_bytes());
  REQUIRE(b1);
  REQUIRE(b2);
  auto t0 = std::chrono::steady_clock::now();
  auto errs = f.store->read_full_batch(f.hashes,
                                       {f.buf.data(), b1->data(), b2->data()});
  auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK_EQ(code_of(errs[0]), storage_errc::none);
  CHECK_EQ(code_of(errs[1]), storage_errc::none);
  CHECK_EQ(code_of(errs[2]), storage_errc::injected_fault);
  CHECK_GE(elapsed, std::chrono::milliseconds{60});
  // The blocks that did read are byte-exact.
  auto geo = f.store->geometry();
  CHECK(kv_check_layer(f.hashes[1], 3, geo.block_tokens,
                       geo.bytes_per_token_layer,
                       b1->data() + geo.layer_offset(3)));
}

TEST_CASE("a FIFO, socket, device or directory in a block's place: refused, "
          "never blocking") {
  // A blocking open() of a FIFO would wait for a writer forever: the alarm
  // ends the suite (as a failure) if any read below blocks.
  ::alarm(60);
  for (auto kind : {backend_kind::pread, backend_kind::automatic}) {
    fixture f;
    auto backend = make_backend(backend_config{kind, 4});
    REQUIRE(backend);
    auto store = block_store::open(
        store_config{f.dir.path(), "m1", kv_geometry{4, 8, 100}}, *backend);
    REQUIRE(store);
    auto& s = **store;
    auto fifo = f.dir.file("fifo");
    REQUIRE_EQ(::mkfifo(fifo.c_str(), 0644), 0);
    // Each hostile thing takes the place of a block file.
    auto replace = [&](block_hash h,
                       const std::function<void(const std::string&)>& make) {
      auto path = s.path_of(h);
      REQUIRE_EQ(::unlink(path.c_str()), 0);
      make(path);
    };
    replace(f.hashes[0], [](const std::string& p) {
      REQUIRE_EQ(::mkfifo(p.c_str(), 0644), 0);
    });
    int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    replace(f.hashes[1], [&](const std::string& p) {
      // Bound at a short path (sun_path is small), then moved in place.
      auto at = f.dir.file("s");
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      REQUIRE_LT(at.size(), sizeof(addr.sun_path));
      std::strcpy(addr.sun_path, at.c_str());
      REQUIRE_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
                 0);
      REQUIRE_EQ(::rename(at.c_str(), p.c_str()), 0);
    });
    replace(f.hashes[2], [](const std::string& p) {
      REQUIRE_EQ(::symlink("/dev/zero", p.c_str()), 0);
    });
    std::vector<uint32_t> more(f.tokens);
    for (uint32_t i = 0; i < 32; ++i) // blocks 3 .. 6 (0 .. 2 are f's)
      more.push_back(1000 + i);
    REQUIRE(populate(s, {more}));
    auto extra = block_hashes(more, 8);
    replace(extra[3], [&](const std::string& p) {
      REQUIRE_EQ(::symlink(fifo.c_str(), p.c_str()), 0);
    });
    replace(extra[4], [](const std::string& p) {
      REQUIRE_EQ(::mkdir(p.c_str(), 0755), 0);
    });
    auto t0 = std::chrono::steady_clock::now();
    for (auto h : {f.hashes[0], f.hashes[1], f.hashes[2], extra[3], extra[4]}) {
      CAPTURE(s.path_of(h));
      CHECK_EQ(f.read_full(s, h), storage_errc::not_regular_file);
      std::vector<std::byte> dst(s.geometry().layer_bytes());
      CHECK_EQ(code_of(s.read_layer(h, 1, dst.data())),
               storage_errc::not_regular_file);
    }
    // A batch with hostile and good blocks: the good ones still read.
    std::vector<aligned_buffer> bufs;
    std::vector<std::byte*> dsts;
    std::vector<block_hash> batch{extra[5], f.hashes[0], extra[3]};
    for (size_t i = 0; i < batch.size(); ++i) {
      bufs.push_back(
          std::move(*aligned_buffer::make(s.geometry().file_bytes())));
      dsts.push_back(bufs.back().data());
    }
    auto errs = s.read_full_batch(batch, dsts);
    CHECK_EQ(code_of(errs[0]), storage_errc::none);
    CHECK_EQ(code_of(errs[1]), storage_errc::not_regular_file);
    CHECK_EQ(code_of(errs[2]), storage_errc::not_regular_file);
    CHECK_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    ::close(sock);
  }
  ::alarm(0);
}
