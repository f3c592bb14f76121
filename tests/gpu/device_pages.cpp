// ctest-label: engines
// gpu::device_pages (an engine's KV pages in device memory it owns): where
// no CUDA device exists, registering any address fails with "no CUDA
// device: <the driver's reason>"; on a device, host memory and unknown
// addresses are refused naming the address, real device memory registers,
// and staged copies in both directions are byte-exact in place (checked
// through the cuda backend's own copies). The device cases print why and
// return where no CUDA device exists (a driver too old or a device that
// cannot be used fails).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/device_pages.hpp"
#include "tests/gpu/device_checks.hpp"

using namespace dualpath::gpu;

namespace {

/// Whether a CUDA device exists; fails the test where one exists but cannot
/// be used; prints why not otherwise.
bool have_device(const std::string& what) {
  auto count = probe_cuda();
  if (count)
    return true;
  if (count.error() != gpu_errc::no_device)
    FAIL(
        "a CUDA device exists but cannot be used: " << describe(count.error()));
  MESSAGE("SKIP " << what << ": " << describe(count.error()));
  return false;
}

/// A cuda device backend of `hbm_budget` bytes (one pool slab).
std::shared_ptr<device> cuda_backend(uint64_t hbm_budget) {
  device_options opts;
  opts.backend = backend_choice::cuda;
  opts.hbm_budget = hbm_budget;
  auto dev = make_cuda_device(opts);
  REQUIRE_MESSAGE(dev, (dev ? "" : describe(dev.error())));
  return *dev;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

} // namespace

TEST_CASE("device pages: without a CUDA device nothing registers, naming why") {
  auto count = probe_cuda();
  if (count) {
    MESSAGE("a CUDA device exists; the no-device refusal is not reachable");
    return;
  }
  REQUIRE(count.error() == gpu_errc::no_device);
  // A fake device address of the right shape: refused before any use.
  auto pages =
      device_pages::make(reinterpret_cast<void*>(0x7f0000000000), 1 << 20);
  REQUIRE_FALSE(pages);
  CHECK(pages.error() == gpu_errc::no_device);
  auto text = describe(pages.error());
  MESSAGE("refused: " << text);
  CHECK(starts_with(text, "no CUDA device: "));
  CHECK(text == describe(count.error())); // the driver's own reason
}

TEST_CASE("device pages: a null base or an empty range is refused") {
  auto null = device_pages::make(nullptr, 4096);
  REQUIRE_FALSE(null);
  CHECK(null.error() == gpu_errc::invalid_argument);
  int x = 0;
  auto empty = device_pages::make(&x, 0);
  REQUIRE_FALSE(empty);
  CHECK(empty.error() == gpu_errc::invalid_argument);
}

TEST_CASE("device pages: host memory and unknown addresses are refused") {
  if (!have_device("device pages: refusals on a device"))
    return;
  std::vector<std::byte> host(1 << 16);
  auto h = device_pages::make(host.data(), host.size());
  REQUIRE_FALSE(h);
  CHECK(h.error() == gpu_errc::invalid_argument);
  MESSAGE("host memory: " << describe(h.error()));
  CHECK(describe(h.error()).find("is not device memory") != std::string::npos);
  auto fake = device_pages::make(reinterpret_cast<void*>(0x10000), 4096);
  REQUIRE_FALSE(fake);
  CHECK(fake.error() == gpu_errc::invalid_argument);
  MESSAGE("unknown address: " << describe(fake.error()));
}

TEST_CASE("device pages: staged copies land byte-exact in the caller's "
          "device memory") {
  if (!have_device("device pages: staged copies"))
    return;
  auto dev = cuda_backend(64 << 20);
  constexpr size_t page = 4096;
  constexpr size_t n = 16;
  auto buf = dev->allocate(page * n);
  REQUIRE(buf);
  // The pages spill past their allocation (the backend's 64 MiB slab) into
  // memory no allocation holds.
  auto spill = device_pages::make(buf->data(), page * n + (64 << 20));
  REQUIRE_FALSE(spill);
  CHECK(spill.error() == gpu_errc::invalid_argument);
  CHECK_MESSAGE(describe(spill.error()).find("run past the allocation")
                    != std::string::npos,
                describe(spill.error()));
  auto pages = device_pages::make(buf->data(), page * n);
  REQUIRE_MESSAGE(pages, (pages ? "" : describe(pages.error())));
  auto& p = **pages;
  MESSAGE("registered on " << p.describe());
  CHECK(p.size() == page * n);
  // Host -> device: pages 3 and 9 from the staging area.
  auto src = checks::pattern(page * n, 5);
  std::memcpy(p.staging(), src.data(), src.size());
  REQUIRE(!p.to_device({copy_chunk{3 * page, 3 * page, page},
                        copy_chunk{9 * page, 9 * page, page}}));
  // Read the device memory back with the backend's own copy.
  checks::pinnable back(page * n);
  auto pin = dev->pin(back.data(), back.size());
  REQUIRE(pin);
  auto s = dev->make_stream();
  REQUIRE(s);
  REQUIRE(!dev->copy_d2h(*buf, *pin, {copy_chunk{0, 0, page * n}}, *s));
  REQUIRE(!dev->synchronize(*s));
  CHECK(std::memcmp(back.data() + 3 * page, src.data() + 3 * page, page) == 0);
  CHECK(std::memcmp(back.data() + 9 * page, src.data() + 9 * page, page) == 0);
  // Device -> host: new bytes written by the backend, staged back.
  auto fresh = checks::pattern(page * n, 11);
  std::memcpy(back.data(), fresh.data(), fresh.size());
  REQUIRE(!dev->copy_h2d(*pin, *buf, {copy_chunk{0, 0, page * n}}, *s));
  REQUIRE(!dev->synchronize(*s));
  std::memset(p.staging(), 0, p.size());
  REQUIRE(!p.to_host({copy_chunk{0, 0, page * n}}));
  CHECK(std::memcmp(p.staging(), fresh.data(), fresh.size()) == 0);
  // A chunk past the pages is refused, nothing copied.
  auto bad = p.to_device({copy_chunk{0, page * n - 8, 16}});
  CHECK(bad == gpu_errc::out_of_bounds);
}

TEST_CASE("device pages: a range reaching into a neighbouring allocation is "
          "refused") {
  if (!have_device("device pages: neighbouring allocations"))
    return;
  // Two device backends' slabs, each its own cudaMalloc; where the second
  // lies right behind the first, a range over both has device memory at its
  // first and its last byte and is still refused.
  auto a = cuda_backend(2 << 20);
  auto b = cuda_backend(2 << 20);
  auto x = a->allocate(2 << 20);
  REQUIRE(x);
  auto y = b->allocate(2 << 20);
  REQUIRE(y);
  auto* lo = std::min(x->data(), y->data());
  auto* hi = std::max(x->data(), y->data());
  auto whole = device_pages::make(lo, static_cast<size_t>(hi - lo) + (2 << 20));
  REQUIRE_FALSE(whole);
  CHECK(whole.error() == gpu_errc::invalid_argument);
  CHECK_MESSAGE(describe(whole.error()).find("run past the allocation")
                    != std::string::npos,
                describe(whole.error()));
  MESSAGE("the two slabs lie " << (hi - lo) << " bytes apart");
  // Each slab on its own registers.
  CHECK(device_pages::make(x->data(), 2 << 20));
  CHECK(device_pages::make(y->data(), 2 << 20));
}
