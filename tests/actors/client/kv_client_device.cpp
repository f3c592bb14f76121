// ctest-label: integration
// kv_client with KV pages in CUDA device memory (memory_kind::cuda): where
// no CUDA device exists, registering device pages fails with "no CUDA
// device: <the driver's reason>" and nothing is registered (host pages
// register afterwards); on a device, loads on the PE path, the DE path and
// split land byte-exact in the device pages (read back through the cuda
// backend), each layer by the time wait_for_layer returns, and blocks saved
// from device pages reload byte-exact. The device case prints why and
// returns where no CUDA device exists.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

#include "actors/client/kv_client.hpp"
#include "gpu/device.hpp"
#include "tests/actors/client/client_support.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/backend.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors::client;
using namespace dualpath::transport::storage;

namespace {

constexpr uint32_t layers = 3;
constexpr uint32_t block_tokens = 4;
constexpr uint32_t bpt = 64;
constexpr uint32_t pages = 16;

kv_geometry geometry() {
  return kv_geometry{layers, block_tokens, bpt};
}

std::vector<uint32_t> prompt(uint32_t blocks) {
  return test::client_prompt(blocks, block_tokens, 0);
}

struct env {
  test::temp_dir dir{"dp-client-dev"};
  std::unique_ptr<kv_client> client;

  env() {
    auto be = make_backend(backend_config{});
    REQUIRE(be);
    {
      auto s =
          block_store::open(store_config{dir.path(), "m", geometry()}, *be);
      REQUIRE(s);
      REQUIRE(populate(**s, {prompt(6)}));
    }
    client_config cfg;
    cfg.store_dir = dir.path();
    cfg.model_id = "m";
    cfg.geometry = geometry();
    cfg.buffer_blocks = 16;
    auto c = kv_client::make(cfg);
    REQUIRE(c);
    client = std::move(*c);
  }
};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

} // namespace

TEST_CASE("device pages without a CUDA device: refused naming why, nothing "
          "registered") {
  auto count = gpu::probe_cuda();
  if (count) {
    MESSAGE("a CUDA device exists; the no-device refusal is not reachable");
    return;
  }
  env e;
  auto bytes = uint64_t{pages} * geometry().layer_bytes();
  std::vector<kv_layer_memory> mem;
  for (uint32_t l = 0; l < layers; ++l)
    mem.push_back(kv_layer_memory{
        reinterpret_cast<void*>(uintptr_t{0x7f0000000000} + l * bytes), bytes,
        memory_kind::cuda});
  auto err = e.client->register_kv(mem);
  REQUIRE(err);
  CHECK(err == gpu::gpu_errc::no_device);
  auto text = gpu::describe(err);
  MESSAGE("refused: " << text);
  CHECK(starts_with(text, "layer 0: no CUDA device: "));
  CHECK(text.find(gpu::describe(count.error())) != std::string::npos);
  CHECK(e.client->pages() == 0);
  CHECK(e.client->kv_memory_path().empty());
  // Nothing was registered: host pages register now, and load.
  std::vector<std::vector<std::byte>> host(layers,
                                           std::vector<std::byte>(bytes));
  std::vector<kv_layer_memory> hmem;
  for (auto& h : host)
    hmem.push_back(kv_layer_memory{h.data(), h.size()});
  REQUIRE(!e.client->register_kv(hmem));
  CHECK(e.client->pages() == pages);
  CHECK(starts_with(e.client->kv_memory_path(), "host pages"));
  load_request r;
  r.blocks = test::lookup_hit(*e.client, prompt(6)).blocks;
  REQUIRE(r.blocks.size() == 6);
  r.pages = {0, 1, 2, 3, 4, 5};
  auto t = e.client->start_load(r);
  REQUIRE(t);
  auto done = e.client->wait(*t);
  REQUIRE(done);
  CHECK(!done->error);
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t b = 0; b < 6; ++b)
      CHECK(kv_check_layer(r.blocks[b], l, block_tokens, bpt,
                           host[l].data() + b * geometry().layer_bytes()));
}

TEST_CASE("device pages: a page count that does not fit is refused first") {
  env e;
  std::vector<kv_layer_memory> mem(
      layers,
      kv_layer_memory{reinterpret_cast<void*>(uintptr_t{0x7f0000000000}),
                      geometry().layer_bytes() + 1, memory_kind::cuda});
  auto err = e.client->register_kv(mem);
  REQUIRE(err);
  CHECK(err == caf::sec::invalid_argument);
  CHECK(gpu::describe(err).find("no whole number of pages")
        != std::string::npos);
  CHECK(e.client->pages() == 0);
}

TEST_CASE("device pages: loads on each path and saves are byte-exact in "
          "device memory") {
  auto count = gpu::probe_cuda();
  if (!count) {
    if (count.error() != gpu::gpu_errc::no_device)
      FAIL("a CUDA device exists but cannot be used: "
           << gpu::describe(count.error()));
    MESSAGE(
        "SKIP device pages loads and saves: " << gpu::describe(count.error()));
    return;
  }
  gpu::device_options opts;
  opts.backend = gpu::backend_choice::cuda;
  opts.hbm_budget = 256 << 20;
  auto dev = gpu::make_cuda_device(opts);
  REQUIRE_MESSAGE(dev, (dev ? "" : gpu::describe(dev.error())));
  auto page = geometry().layer_bytes();
  auto bytes = uint64_t{pages} * page;
  std::vector<gpu::device_buffer> hbm;
  std::vector<kv_layer_memory> mem;
  for (uint32_t l = 0; l < layers; ++l) {
    auto b = (*dev)->allocate(bytes);
    REQUIRE(b);
    mem.push_back(kv_layer_memory{b->data(), bytes, memory_kind::cuda});
    hbm.push_back(std::move(*b));
  }
  env e;
  REQUIRE(!e.client->register_kv(mem));
  MESSAGE("path: " << e.client->kv_memory_path());
  CHECK(starts_with(e.client->kv_memory_path(), "device pages on cuda device"));
  // Reads a layer's device pages back through the backend's own copy.
  std::vector<std::byte> back(bytes);
  auto pin = (*dev)->pin(back.data(), back.size());
  REQUIRE(pin);
  auto s = (*dev)->make_stream();
  REQUIRE(s);
  auto read_layer = [&](uint32_t l) {
    REQUIRE(
        !(*dev)->copy_d2h(hbm[l], *pin, {gpu::copy_chunk{0, 0, bytes}}, *s));
    REQUIRE(!(*dev)->synchronize(*s));
  };
  auto write_layer = [&](uint32_t l) {
    REQUIRE(
        !(*dev)->copy_h2d(*pin, hbm[l], {gpu::copy_chunk{0, 0, bytes}}, *s));
    REQUIRE(!(*dev)->synchronize(*s));
  };
  auto hit = test::lookup_hit(*e.client, prompt(6));
  REQUIRE(hit.blocks.size() == 6);
  for (auto path : {load_path::pe, load_path::de, load_path::split}) {
    CAPTURE(to_string(path));
    std::memset(back.data(), 0, back.size());
    for (uint32_t l = 0; l < layers; ++l)
      write_layer(l);
    load_request r;
    r.blocks = hit.blocks;
    r.pages = {9, 3, 0, 15, 4, 8};
    r.path = path;
    auto t = e.client->start_load(r);
    REQUIRE(t);
    for (uint32_t l = 0; l < layers; ++l) {
      REQUIRE(!e.client->wait_for_layer(*t, l));
      read_layer(l); // in device memory once waited for
      for (size_t b = 0; b < r.blocks.size(); ++b)
        CHECK(kv_check_layer(r.blocks[b], l, block_tokens, bpt,
                             back.data() + r.pages[b] * page));
    }
    auto done = e.client->wait(*t);
    REQUIRE(done);
    CHECK(!done->error);
    CHECK(done->blocks_ok == 6);
  }
  // Save three new blocks computed into device pages 10..12, reload them
  // into pages 0..2 and compare in device memory.
  auto tokens = prompt(6);
  tokens.resize(9 * block_tokens + 2);
  std::iota(tokens.begin() + 6 * block_tokens + 1, tokens.end(), 50000u);
  for (uint32_t l = 0; l < layers; ++l) {
    for (size_t i = 0; i < bytes; ++i)
      back[i] = static_cast<std::byte>((l * 31 + i * 7) & 0xff);
    write_layer(l);
  }
  save_request sv;
  sv.tokens = tokens;
  sv.first_block = 6;
  sv.pages = {10, 11, 12};
  auto st = e.client->start_save(sv);
  REQUIRE(st);
  auto sd = e.client->wait(*st);
  REQUIRE(sd);
  CHECK(!sd->error);
  auto hit9 = test::lookup_hit(*e.client, tokens);
  REQUIRE(hit9.blocks.size() == 9);
  load_request r;
  r.blocks.assign(hit9.blocks.begin() + 6, hit9.blocks.end());
  r.pages = {0, 1, 2};
  r.path = load_path::de;
  auto lt = e.client->start_load(r);
  REQUIRE(lt);
  auto fin = e.client->wait(*lt);
  REQUIRE(fin);
  CHECK(!fin->error);
  for (uint32_t l = 0; l < layers; ++l) {
    read_layer(l);
    for (uint32_t b = 0; b < 3; ++b)
      CHECK(std::memcmp(back.data() + b * page, back.data() + (10 + b) * page,
                        page)
            == 0);
  }
}
