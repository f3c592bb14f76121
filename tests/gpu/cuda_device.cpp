// ctest-label: engines
// The cuda backend of gpu::device on real device memory: the same checks as
// the host backend (byte-exact scattered H2D/D2H copies per chunk and
// batched, events, HBM budget, bad arguments), with the checksum computed by
// the CUDA kernel on the device. Skips, printing why, where no CUDA device
// exists (or the build has no CUDA).
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
std::shared_ptr<device> make_cuda(uint64_t budget) {
  auto count = probe_cuda();
  if (!count) {
    const auto& ctx = count.error().context();
    dualpath::test::skip_suite("gpu.cuda_device",
                               ctx.match_elements<std::string>()
                                   ? ctx.get_as<std::string>(0)
                                   : std::string{"no CUDA device"});
  }
  device_options opts;
  opts.backend = backend_choice::cuda;
  opts.hbm_budget = budget;
  auto dev = make_cuda_device(opts);
  REQUIRE(dev);
  return *dev;
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

TEST_CASE("cuda backend: scattered Layer Block rows copy byte-exact") {
  checks::copies_are_byte_exact(make_cuda, copy_method::per_chunk);
}

TEST_CASE("cuda backend: batched copies (cudaMemcpyBatchAsync)") {
  auto dev = make_cuda(1 << 20);
  if (!dev->capabilities().batched_copy) {
    MESSAGE("batched path not exercised: " << dev->capabilities().notes);
    CHECK_FALSE(dev->capabilities().notes.empty());
    return;
  }
  checks::copies_are_byte_exact(make_cuda, copy_method::batched);
}

TEST_CASE("cuda backend: events complete after the work before them") {
  checks::events_complete_after_work(make_cuda);
}

TEST_CASE("cuda backend: the HBM budget refuses allocations beyond it") {
  checks::budget_is_enforced(make_cuda);
}

TEST_CASE("cuda backend: bad arguments are errors") {
  checks::bad_arguments_are_errors(make_cuda);
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
}
