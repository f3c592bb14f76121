// ctest-label: engines
// The host backend of gpu::device (host memory standing in for HBM): the
// shared device checks (byte-exact scattered copies, events, budget, bad
// arguments) plus the factory's backend selection and error rendering, and
// the start hook of each stream's copy thread (device_options::thread_start).
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <future>
#include <string>
#include <utility>

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

TEST_CASE("host backend: the checks every backend passes") {
  checks::every_backend_passes(make_host);
}

TEST_CASE("host backend: batched copies are byte-exact too") {
  CHECK(make_host(1 << 20)->capabilities().batched_copy);
  checks::copies_are_byte_exact(make_host, copy_method::batched);
}

TEST_CASE("host backend: a reserved pool is one slab") {
  // A reserved pool is one slab taken at creation: allocations up to the
  // budget add none, and an engine's whole HBM is one region.
  device_options opts;
  opts.backend = backend_choice::host;
  opts.hbm_budget = 10ull << 20;
  opts.pool_reserve = opts.hbm_budget;
  auto dev = make_host_device(opts);
  REQUIRE(dev);
  CHECK_EQ((*dev)->stats().slabs, 1u);
  REQUIRE_EQ((*dev)->slabs().size(), 1u);
  CHECK_GE((*dev)->slabs()[0].size, opts.hbm_budget);
  std::vector<device_buffer> bufs;
  for (int i = 0; i < 10; ++i) {
    auto b = (*dev)->allocate(1ull << 20);
    REQUIRE(b);
    bufs.push_back(std::move(*b));
  }
  CHECK((*dev)->allocate(1).error() == gpu_errc::budget_exceeded);
  CHECK_EQ((*dev)->stats().slabs, 1u);
  CHECK_EQ((*dev)->stats().host_waits, 0u);
  // Host memory is not exported: callers register it as host memory.
  auto exported = (*dev)->export_dmabuf(0);
  REQUIRE_FALSE(exported);
  CHECK(exported.error() == gpu_errc::unsupported);
  CHECK_FALSE((*dev)->capabilities().dmabuf_export);
  CHECK(!(*dev)->order_remote_writes());
}

TEST_CASE("copy method: automatic picks batched only where the probe said so") {
  // The choice, with the probe's result injected.
  CHECK(resolve_copy_method(copy_method::automatic, true, 61)
        == copy_method::batched);
  CHECK(resolve_copy_method(copy_method::automatic, true, 1)
        == copy_method::per_chunk);
  CHECK(resolve_copy_method(copy_method::automatic, false, 61)
        == copy_method::per_chunk);
  CHECK(resolve_copy_method(copy_method::per_chunk, true, 61)
        == copy_method::per_chunk);
  CHECK(resolve_copy_method(copy_method::batched, true, 1)
        == copy_method::batched);
  CHECK(resolve_copy_method(copy_method::batched, false, 61).error()
        == gpu_errc::unsupported);
  // On a device whose batch API is off (as after a failed probe), automatic
  // copies go one call per chunk and stay byte-exact; explicit batched
  // copies are refused.
  auto run = [](batch_copy_use use) {
    device_options opts;
    opts.backend = backend_choice::host;
    opts.hbm_budget = 64ull << 20;
    opts.batch_copy = use;
    auto dev = make_host_device(opts);
    REQUIRE(dev);
    auto src = checks::pattern(61 * 656, 4);
    checks::pinnable back(src.size());
    auto pin = (*dev)->pin(src.data(), src.size());
    auto back_pin = (*dev)->pin(back.data(), back.size());
    auto buf = (*dev)->allocate(src.size());
    auto s = (*dev)->make_stream();
    REQUIRE((pin && back_pin && buf && s));
    auto chunks = checks::shuffled_rows(61, 656, 2);
    REQUIRE(!(*dev)->copy_h2d(*pin, *buf, chunks, *s));
    REQUIRE(!(*dev)->copy_d2h(*buf, *back_pin, checks::inverse(chunks), *s));
    REQUIRE(!(*dev)->synchronize(*s));
    CHECK(back == src);
    auto refused =
        (*dev)->copy_h2d(*pin, *buf, chunks, *s, copy_method::batched);
    return std::make_pair((*dev)->stats(), refused);
  };
  auto [on, on_refused] = run(batch_copy_use::probe);
  CHECK_EQ(on.copy_lists, 3u);
  CHECK_EQ(on.batched_lists, 3u);
  CHECK_EQ(on.copy_calls, 3u);
  CHECK_FALSE(on_refused);
  auto [off, off_refused] = run(batch_copy_use::off);
  CHECK_EQ(off.copy_lists, 2u);
  CHECK_EQ(off.batched_lists, 0u);
  CHECK_EQ(off.copy_calls, 2u * 61);
  CHECK(off_refused == gpu_errc::unsupported);
}

TEST_CASE("engine ranks map to CUDA devices as configured") {
  // gpu.device = first ordinal; ranks wrap round robin over the machine's.
  CHECK(device_for_rank(0, 0, {}, 8) == 0);
  CHECK(device_for_rank(7, 0, {}, 8) == 7);
  CHECK(device_for_rank(3, 2, {}, 8) == 5);
  CHECK(device_for_rank(7, 2, {}, 8) == 1);
  CHECK(device_for_rank(5, 0, {}, 1) == 0); // one GPU: every rank shares it
  auto bad = device_for_rank(0, 8, {}, 8);
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == gpu_errc::invalid_argument);
  CHECK(describe(bad.error()).find("gpu.device = 8") != std::string::npos);
  // A node's gpus list wins.
  CHECK(device_for_rank(1, 0, {6, 3}, 8) == 3);
  auto missing = device_for_rank(2, 0, {6, 3}, 8);
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("gpus list") != std::string::npos);
  auto absent = device_for_rank(0, 0, {9}, 8);
  REQUIRE_FALSE(absent);
  CHECK(describe(absent.error()).find("device 9") != std::string::npos);
  CHECK(device_for_rank(0, 0, {}, 0).error() == gpu_errc::no_device);
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
  checks::pinnable host(64);
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
    // No usable GPU here: host, and the reason carries the probe's
    // explanation (no driver, no device, or a driver too old).
    CHECK((count.error() == gpu_errc::no_device
           || count.error() == gpu_errc::driver_too_old));
    CHECK(chosen->dev->capabilities().kind == backend_kind::host);
    CHECK(chosen->reason.find("because " + describe(count.error()))
          != std::string::npos);
    opts.backend = backend_choice::cuda;
    auto forced = make_device(opts);
    REQUIRE_FALSE(forced);
    CHECK_EQ(forced.error().code(), count.error().code());
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

TEST_CASE("one registration serves every device of a backend") {
  // The decode node's buffer is registered once and copied from by every
  // GPU of the node: a device takes another's registration without
  // registering again, and dropping its handle leaves the owner's intact.
  auto a = make_host(1 << 20);
  auto b = make_host(1 << 20);
  std::vector<std::byte> host(4096);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<std::byte>(i * 7);
  auto pinned = a->pin(host.data(), host.size());
  REQUIRE(pinned);
  auto shared = b->share_pinned(*pinned);
  REQUIRE(shared);
  CHECK(shared->owner() == b.get());
  CHECK(shared->data() == pinned->data());
  auto buf = b->allocate(1024);
  REQUIRE(buf);
  auto s = b->make_stream();
  REQUIRE(s);
  REQUIRE_FALSE(b->copy_h2d(*shared, *buf, {copy_chunk{512, 0, 1024}}, *s));
  REQUIRE_FALSE(b->synchronize(*s));
  std::vector<std::byte> back(1024);
  auto p = b->pin(back.data(), back.size());
  REQUIRE(p);
  REQUIRE_FALSE(b->copy_d2h(*buf, *p, {copy_chunk{0, 0, 1024}}, *s));
  REQUIRE_FALSE(b->synchronize(*s));
  CHECK(std::equal(back.begin(), back.end(), host.begin() + 512));
  // The shared handle goes; the owner's registration still copies.
  shared->reset();
  auto buf2 = a->allocate(64);
  auto s2 = a->make_stream();
  REQUIRE(buf2);
  REQUIRE(s2);
  CHECK_FALSE(a->copy_h2d(*pinned, *buf2, {copy_chunk{0, 0, 64}}, *s2));
  // An empty registration is refused.
  CHECK_FALSE(b->share_pinned(pinned_host{}));
}

TEST_CASE("host backend: each stream's copy thread runs the start hook") {
  // What a node sets on the threads that copy and checksum its KV: their
  // name and SCHED_IDLE. The stream's own work sees it (notify() runs on the
  // stream's thread), and every stream starts its thread through the hook.
  std::atomic<int> started{0};
  device_options opts;
  opts.backend = backend_choice::host;
  opts.hbm_budget = 1 << 20;
  opts.thread_start = [&started] {
    ::pthread_setname_np(::pthread_self(), "dp-test-gpu");
    sched_param p{};
    ::sched_setscheduler(0, SCHED_IDLE, &p);
    ++started;
    return caf::error{};
  };
  auto dev = make_host_device(opts);
  REQUIRE(dev);
  auto s1 = (*dev)->make_stream();
  auto s2 = (*dev)->make_stream();
  REQUIRE(s1);
  REQUIRE(s2);
  CHECK(started.load() == 2);
  auto e = (*dev)->make_event();
  REQUIRE(e);
  REQUIRE_FALSE((*dev)->record(*e, *s2));
  std::promise<std::pair<int, std::string>> seen;
  REQUIRE_FALSE((*dev)->notify(*e, *s2, [&seen] {
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof(name));
    seen.set_value({::sched_getscheduler(0), name});
  }));
  auto [policy, name] = seen.get_future().get();
  CHECK(policy == SCHED_IDLE);
  CHECK(name == "dp-test-gpu");
}

TEST_CASE("host backend: a failing start hook fails the stream, naming it") {
  device_options opts;
  opts.backend = backend_choice::host;
  opts.hbm_budget = 1 << 20;
  opts.thread_start = [] {
    return caf::make_error(caf::sec::runtime_error, "setpriority: EACCES");
  };
  auto dev = make_host_device(opts);
  REQUIRE(dev);
  auto s = (*dev)->make_stream();
  REQUIRE_FALSE(s);
  CHECK(static_cast<gpu_errc>(s.error().code()) == gpu_errc::system_error);
  CHECK(caf::to_string(s.error()).find("setpriority: EACCES")
        != std::string::npos);
}
