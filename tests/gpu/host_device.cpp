// ctest-label: engines
// The host backend of gpu::device (host memory standing in for HBM): the
// shared device checks (byte-exact scattered copies, events, budget, bad
// arguments) plus the factory's backend selection and error rendering.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "gpu/device.hpp"
#include "tests/gpu/device_checks.hpp"

using namespace dualpath::gpu;

namespace {

std::shared_ptr<device> make_host(uint64_t budget) {
  device_options opts;
  opts.backend = backend_choice::host;
  opts.hbm_budget = budget;
  auto dev = make_host_device(opts);
  REQUIRE(dev);
  return *dev;
}

} // namespace

TEST_CASE("host backend: scattered Layer Block rows copy byte-exact") {
  checks::copies_are_byte_exact(make_host, copy_method::per_chunk);
}

TEST_CASE("host backend: batched copies are byte-exact too") {
  CHECK(make_host(1 << 20)->capabilities().batched_copy);
  checks::copies_are_byte_exact(make_host, copy_method::batched);
}

TEST_CASE("host backend: events complete after the work before them") {
  checks::events_complete_after_work(make_host);
}

TEST_CASE("host backend: the HBM budget refuses allocations beyond it") {
  checks::budget_is_enforced(make_host);
}

TEST_CASE("host backend: bad arguments are errors") {
  checks::bad_arguments_are_errors(make_host);
}

TEST_CASE("host backend: copies are asynchronous; the stream runs them") {
  // The submitting thread does not run the copy: after copy_h2d returns, the
  // destination is written by the stream's worker. Destroying the stream
  // drains it, so the bytes are there afterwards even without an event.
  auto dev = make_host(256ull << 20);
  CHECK(dev->capabilities().host_addressable);
  CHECK_FALSE(dev->capabilities().real_device);
  auto src = checks::pattern(64ull << 20, 5);
  auto pin = dev->pin(src.data(), src.size());
  REQUIRE(pin);
  auto buf = dev->allocate(src.size());
  REQUIRE(buf);
  {
    auto s = dev->make_stream();
    REQUIRE(s);
    REQUIRE(!dev->copy_h2d(*pin, *buf, {{0, 0, src.size()}}, *s));
  }
  CHECK(std::equal(src.begin(), src.end(), buf->data()));
}

TEST_CASE("host backend without memory: counts the budget, refuses copies") {
  device_options opts;
  opts.backend = backend_choice::host;
  opts.hbm_budget = 1000;
  opts.backed = false;
  auto made = make_host_device(opts);
  REQUIRE(made);
  auto dev = *made;
  CHECK_FALSE(dev->capabilities().host_addressable);
  // Far more than the process could hold if it were memory: only counted.
  auto a = dev->allocate(600);
  REQUIRE(a);
  CHECK(a->valid());
  CHECK_EQ(dev->bytes_allocated(), 600u);
  auto b = dev->allocate(500);
  REQUIRE_FALSE(b);
  CHECK(b.error() == gpu_errc::budget_exceeded);
  auto c = dev->allocate(400);
  REQUIRE(c);
  CHECK_EQ(dev->bytes_allocated(), 1000u);
  a->reset();
  CHECK_EQ(dev->bytes_allocated(), 400u);
  // Nothing to copy to or from: an error, not a write through data().
  std::vector<std::byte> host(64);
  auto pinned = dev->pin(host.data(), host.size());
  REQUIRE(pinned);
  auto stream = dev->make_stream();
  REQUIRE(stream);
  auto err = dev->copy_h2d(*pinned, *c, {copy_chunk{0, 0, 64}}, *stream);
  CHECK(err);
  CHECK(to_string(err).find("accounting-only") != std::string::npos);
}

TEST_CASE("factory: gpu.backend parses and auto falls back to host") {
  CHECK(parse_backend_choice("auto") == backend_choice::automatic);
  CHECK(parse_backend_choice("cuda") == backend_choice::cuda);
  CHECK(parse_backend_choice("host") == backend_choice::host);
  auto bad = parse_backend_choice("tpu");
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == gpu_errc::invalid_argument);

  device_options opts;
  opts.hbm_budget = 32ull << 20;
  opts.backend = backend_choice::host;
  auto host = make_device(opts);
  REQUIRE(host);
  CHECK(host->dev->capabilities().kind == backend_kind::host);
  CHECK(host->reason.find("as configured") != std::string::npos);

  opts.backend = backend_choice::automatic;
  auto chosen = make_device(opts);
  REQUIRE(chosen);
  MESSAGE("auto: " << chosen->reason);
  CHECK_EQ(chosen->dev->hbm_budget(), opts.hbm_budget);
  if (auto count = probe_cuda()) {
    CHECK(chosen->dev->capabilities().kind == backend_kind::cuda);
  } else {
    // No GPU here: host, and the reason carries the probe's explanation.
    CHECK(count.error() == gpu_errc::no_device);
    CHECK(chosen->dev->capabilities().kind == backend_kind::host);
    CHECK(chosen->reason.find("because no CUDA device") != std::string::npos);
    opts.backend = backend_choice::cuda;
    auto forced = make_device(opts);
    REQUIRE_FALSE(forced);
    CHECK(forced.error() == gpu_errc::no_device);
  }
  opts.backend = backend_choice::host;
  opts.hbm_budget = 0;
  auto zero = make_device(opts);
  CHECK(zero.error() == gpu_errc::invalid_argument);
}

TEST_CASE("errors render with the gpu category") {
  caf::actor_system_config cfg;
  add_error_category(cfg);
  caf::actor_system sys{cfg};
  auto dev = make_host(1 << 20);
  auto refused = dev->allocate(2 << 20);
  REQUIRE_FALSE(refused);
  auto text = sys.render(refused.error());
  MESSAGE(text);
  CHECK(text.find("gpu: budget_exceeded") != std::string::npos);
}
