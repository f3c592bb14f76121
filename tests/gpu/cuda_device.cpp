// ctest-label: engines
// The cuda backend of gpu::device on real device memory: the same checks as
// the host backend (byte-exact scattered H2D/D2H copies per chunk and
// batched, events and completion notices, HBM budget, the pool, segment
// checksums, bad arguments), with the checksums computed by the CUDA kernels
// on the device, plus what only a GPU has (the batch API, dma-buf export).
// Skips, printing why, only where no CUDA device exists (no driver, no GPU,
// or a build without CUDA); a driver too old for the runtime, or a device
// that cannot be set up, fails.
#include <doctest/doctest.h>

#include <chrono>

#include "gpu/device.hpp"
#include "tests/gpu/device_checks.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::gpu;

namespace {

/// A cuda device with `budget` bytes, or the suite is skipped with the
/// probe's reason (e.g. "no CUDA device: cudaGetDeviceCount ->
/// cudaErrorInsufficientDriver (...)").
std::shared_ptr<device>
make_cuda_with(uint64_t budget, batch_copy_use batch = batch_copy_use::probe) {
  auto count = probe_cuda();
  if (!count) {
    if (count.error() == gpu_errc::no_device)
      dualpath::test::skip_suite("gpu.cuda_device", describe(count.error()));
    FAIL(
        "a CUDA device exists but cannot be used: " << describe(count.error()));
  }
  device_options opts;
  opts.backend = backend_choice::cuda;
  opts.hbm_budget = budget;
  opts.batch_copy = batch;
  auto dev = make_cuda_device(opts);
  if (!dev)
    FAIL("make_cuda_device: " << describe(dev.error()));
  return *dev;
}

std::shared_ptr<device> make_cuda(uint64_t budget) {
  return make_cuda_with(budget);
}

} // namespace

TEST_CASE("cuda backend: capabilities of a real device") {
  auto dev = make_cuda(64ull << 20);
  const auto& caps = dev->capabilities();
  MESSAGE("device: " << caps.name << ", " << caps.total_memory
                     << " B, batched_copy=" << caps.batched_copy
                     << ", notes: " << caps.notes);
  CHECK(caps.kind == backend_kind::cuda);
  CHECK(caps.real_device);
  CHECK(caps.device_checksum);
  CHECK_FALSE(caps.host_addressable);
  CHECK(caps.total_memory > 0);
  // The budget is capped at the memory that exists.
  auto capped = make_cuda(~uint64_t{0});
  CHECK_EQ(capped->hbm_budget(), caps.total_memory);
}

TEST_CASE("cuda backend: the checks every backend passes") {
  checks::every_backend_passes(make_cuda);
}

TEST_CASE("cuda backend: batched copies (cudaMemcpyBatchAsync)") {
  // This binary's runtime has the batch API (CUDA >= 12.8) and the driver
  // runs the runtime (probe_cuda passed): a refusal is a failure here, not a
  // skip. Engines fall back to per-chunk copies, which the next case checks.
  auto dev = make_cuda(1 << 20);
  REQUIRE_MESSAGE(dev->capabilities().batched_copy,
                  "batch API unusable: " << dev->capabilities().notes);
  checks::copies_are_byte_exact(make_cuda, copy_method::batched);
  checks::copies_are_byte_exact(make_cuda, copy_method::automatic);
  auto before = dev->stats();
  auto src = checks::pattern(61 * 656, 8);
  auto pin = dev->pin(src.data(), src.size());
  auto buf = dev->allocate(src.size());
  auto s = dev->make_stream();
  REQUIRE((pin && buf && s));
  REQUIRE(!dev->copy_h2d(*pin, *buf, checks::shuffled_rows(61, 656, 5), *s));
  REQUIRE(!dev->synchronize(*s));
  auto after = dev->stats();
  CHECK_EQ(after.batched_lists, before.batched_lists + 1);
  CHECK_EQ(after.copy_calls, before.copy_calls + 1);
}

TEST_CASE("cuda backend: with the batch API off, copies go per chunk") {
  auto make_off = [](uint64_t budget) {
    return make_cuda_with(budget, batch_copy_use::off);
  };
  auto dev = make_off(1 << 20);
  CHECK_FALSE(dev->capabilities().batched_copy);
  CHECK(dev->capabilities().notes.find("batched copies off")
        != std::string::npos);
  checks::copies_are_byte_exact(make_off, copy_method::automatic);
  checks::bad_arguments_are_errors(make_off);
}

TEST_CASE("cuda backend: a pool slab exports as dma-buf where supported") {
  device_options opts;
  opts.backend = backend_choice::cuda;
  opts.hbm_budget = 64ull << 20;
  opts.pool_reserve = opts.hbm_budget;
  make_cuda(1 << 20); // skips without a device
  auto made = make_cuda_device(opts);
  REQUIRE(made);
  auto dev = *made;
  REQUIRE_EQ(dev->slabs().size(), 1u);
  CHECK_EQ(dev->stats().slabs, 1u);
  CHECK(!dev->order_remote_writes());
  if (!dev->capabilities().dmabuf_export) {
    // A capability of the machine (open kernel module, driver), not of this
    // code: stated, and the export refuses with the reason.
    MESSAGE("no dma-buf export here: " << dev->capabilities().notes);
    CHECK(dev->export_dmabuf(0).error() == gpu_errc::unsupported);
    return;
  }
  auto fd = dev->export_dmabuf(0);
  REQUIRE_MESSAGE(fd, (fd ? "" : describe(fd.error())));
  CHECK(fd->valid());
  CHECK_EQ(fd->base(), dev->slabs()[0].base);
  CHECK_EQ(fd->size(), dev->slabs()[0].size);
  CHECK(dev->export_dmabuf(1).error() == gpu_errc::out_of_bounds);
}

TEST_CASE("cuda backend: the device checksum sees corruption in HBM") {
  // Bytes changed on the device after the copy change the device checksum:
  // the kernel reads HBM, it does not echo the host's value.
  auto dev = make_cuda(128ull << 20);
  auto src = checks::pattern(656 * 64, 9);
  auto pin = dev->pin(src.data(), src.size());
  REQUIRE(pin);
  auto buf = dev->allocate(src.size());
  REQUIRE(buf);
  auto s = dev->make_stream();
  REQUIRE(s);
  REQUIRE(!dev->copy_h2d(*pin, *buf, {{0, 0, src.size()}}, *s));
  auto good = dev->checksum(*buf, 0, src.size(), *s);
  REQUIRE(good);
  CHECK_EQ(*good, block_checksum(src.data(), src.size()));
  REQUIRE(!dev->synchronize(*s));
  src[1000] ^= std::byte{0x80};
  REQUIRE(!dev->copy_h2d(*pin, *buf, {{1000, 1000, 1}}, *s));
  auto bad = dev->checksum(*buf, 0, src.size(), *s);
  REQUIRE(bad);
  CHECK_NE(*bad, *good);
  CHECK_EQ(*bad, block_checksum(src.data(), src.size()));
  // A large buffer exercises the grid-stride loop with many blocks.
  auto big_src = checks::pattern(64ull << 20, 13);
  auto big_pin = dev->pin(big_src.data(), big_src.size());
  auto big = dev->allocate(big_src.size());
  REQUIRE(big_pin);
  REQUIRE(big);
  REQUIRE(!dev->copy_h2d(*big_pin, *big, {{0, 0, big_src.size()}}, *s));
  auto big_sum = dev->checksum(*big, 0, big_src.size(), *s);
  REQUIRE(big_sum);
  CHECK_EQ(*big_sum, block_checksum(big_src.data(), big_src.size()));
}

TEST_CASE("cuda backend: per-layer allocate/copy/free cycles stay exact") {
  // The engines' pattern: a layer's buffer is allocated, filled, checked and
  // freed, layer after layer; freed memory is reused (memory pool) and must
  // never show a previous layer's bytes or exceed the budget.
  constexpr size_t layer_bytes = 4096 * 656;
  auto dev = make_cuda(2 * layer_bytes);
  auto s = dev->make_stream();
  REQUIRE(s);
  for (uint64_t layer = 0; layer < 61; ++layer) {
    auto src = checks::pattern(layer_bytes, 100 + layer);
    auto pin = dev->pin(src.data(), src.size());
    REQUIRE(pin);
    auto buf = dev->allocate(layer_bytes);
    REQUIRE(buf);
    REQUIRE(!dev->copy_h2d(*pin, *buf, {{0, 0, layer_bytes}}, *s));
    auto sum = dev->checksum(*buf, 0, layer_bytes, *s);
    REQUIRE(sum);
    CHECK_EQ(*sum, block_checksum(src.data(), layer_bytes));
  }
  CHECK_EQ(dev->bytes_allocated(), 0u);
  CHECK_EQ(dev->peak_bytes_allocated(), layer_bytes);
  // One slab for all 61 layers; the only waits are the 61 checksums'.
  CHECK_EQ(dev->stats().slabs, 1u);
  CHECK_EQ(dev->stats().host_waits, 61u);
}
