// Checks every gpu::device backend must pass, shared by the host suite
// (tests/gpu/host_device.cpp) and the cuda suite (tests/gpu/cuda_device.cpp)
// so both backends are held to the same behaviour. Each function takes a
// device factory (options -> device) so budgets can be set per check.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"

namespace dualpath::gpu::checks {

using factory = std::function<std::shared_ptr<device>(uint64_t budget)>;

/// Host bytes a check pins: whole pages of their own (gpu/host_memory.hpp),
/// so that two pinned buffers never share a page.
using pinnable = std::vector<std::byte, page_allocator<std::byte>>;

/// Deterministic bytes (a Layer Block stand-in): a function of seed and index.
inline pinnable pattern(size_t n, uint64_t seed) {
  pinnable out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x & 0xFF);
  }
  return out;
}

/// The Layer Block chunk list of the bench: `layers` x `tokens` rows of
/// `row` bytes, sent to a device buffer in a shuffled order (so a copy that
/// ignored offsets or reordered chunks would be caught).
inline std::vector<copy_chunk> shuffled_rows(size_t rows, size_t row,
                                             uint64_t seed) {
  std::vector<size_t> dst(rows);
  std::iota(dst.begin(), dst.end(), size_t{0});
  std::mt19937_64 rng{seed};
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<copy_chunk> chunks;
  for (size_t i = 0; i < rows; ++i)
    chunks.push_back(copy_chunk{i * row, dst[i] * row, row});
  return chunks;
}

/// The inverse list: device row dst[i] back to host row i.
inline std::vector<copy_chunk> inverse(const std::vector<copy_chunk>& chunks) {
  std::vector<copy_chunk> out;
  for (const auto& c : chunks)
    out.push_back(copy_chunk{c.dst_offset, c.src_offset, c.length});
  return out;
}

/// H2D of shuffled rows, D2H back through the inverse list: byte-exact; the
/// device checksum of the whole buffer and of unaligned sub-ranges equals the
/// host reference of the bytes that should be there.
inline void copies_are_byte_exact(const factory& make, copy_method method) {
  auto dev = make(64ull << 20);
  REQUIRE(dev != nullptr);
  constexpr size_t row = 656;      // ds-660b Layer Block row (one token, layer)
  constexpr size_t rows = 61 * 64; // 61 layers x 64 tokens
  constexpr size_t bytes = row * rows;
  auto src = pattern(bytes, 7);
  pinnable back(bytes, std::byte{0});
  auto src_pin = dev->pin(src.data(), src.size());
  REQUIRE(src_pin);
  auto back_pin = dev->pin(back.data(), back.size());
  REQUIRE(back_pin);
  auto buf = dev->allocate(bytes);
  REQUIRE(buf);
  auto s = dev->make_stream();
  REQUIRE(s);
  auto done = dev->make_event();
  REQUIRE(done);
  auto chunks = shuffled_rows(rows, row, 11);
  REQUIRE(!dev->copy_h2d(*src_pin, *buf, chunks, *s, method));
  // What the device buffer must hold: row i of src at row dst[i].
  std::vector<std::byte> expect(bytes);
  for (const auto& c : chunks)
    std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(c.src_offset),
                c.length,
                expect.begin() + static_cast<std::ptrdiff_t>(c.dst_offset));
  // Stream order: the checksum runs after the copies without an explicit wait.
  auto sum = dev->checksum(*buf, 0, bytes, *s);
  REQUIRE(sum);
  CHECK_EQ(*sum, block_checksum(expect.data(), bytes));
  // Unaligned offsets and lengths with a partial last word.
  for (auto [off, len] : {std::pair<size_t, size_t>{3, 1001},
                          {656, 656},
                          {bytes - 5, 5},
                          {17, 0}}) {
    auto part = dev->checksum(*buf, off, len, *s);
    REQUIRE(part);
    CHECK_EQ(*part, block_checksum(expect.data() + off, len));
  }
  REQUIRE(!dev->copy_d2h(*buf, *back_pin, inverse(chunks), *s, method));
  REQUIRE(!dev->record(*done, *s));
  REQUIRE(!dev->synchronize(*done));
  auto q = dev->query(*done);
  REQUIRE(q);
  CHECK(*q);
  CHECK(back == src);
}

/// `bytes` of a pattern submitted host -> device -> host on `s` (nothing
/// waited for): `back` equals `src` once the stream got there.
struct round_trip {
  pinnable src;
  pinnable back;
  pinned_host src_pin;
  pinned_host back_pin;
  device_buffer buf;

  round_trip(device& dev, size_t bytes, uint64_t seed, stream& s)
      : src(pattern(bytes, seed)), back(bytes) {
    auto a = dev.pin(src.data(), bytes);
    auto b = dev.pin(back.data(), bytes);
    auto d = dev.allocate(bytes);
    REQUIRE((a && b && d));
    src_pin = std::move(*a);
    back_pin = std::move(*b);
    buf = std::move(*d);
    std::vector<copy_chunk> whole{{0, 0, bytes}};
    REQUIRE(!dev.copy_h2d(src_pin, buf, whole, s));
    REQUIRE(!dev.copy_d2h(buf, back_pin, whole, s));
  }
};

/// Events: a fresh event is complete; an event recorded after a large copy
/// completes once the copy has, and the copied bytes are then visible.
inline void events_complete_after_work(const factory& make) {
  auto dev = make(512ull << 20);
  auto s = dev->make_stream();
  REQUIRE(s);
  auto ev = dev->make_event();
  REQUIRE(ev);
  auto fresh = dev->query(*ev);
  REQUIRE(fresh);
  CHECK(*fresh); // never recorded counts as complete
  round_trip trip{*dev, 128ull << 20, 3, *s};
  REQUIRE(!dev->record(*ev, *s));
  // Poll like an engine would: query until complete (bounded).
  caf::expected<bool> q{false};
  for (int i = 0; i < 100000000 && q && !*q; ++i)
    q = dev->query(*ev);
  REQUIRE(q);
  CHECK(*q);
  CHECK(trip.back == trip.src);
  // Re-recording on an idle stream completes too; stream sync works.
  REQUIRE(!dev->record(*ev, *s));
  REQUIRE(!dev->synchronize(*s));
  auto again = dev->query(*ev);
  REQUIRE(again);
  CHECK(*again);
}

/// The HBM budget: allocations beyond it are refused with budget_exceeded,
/// freeing returns bytes, the peak is remembered.
inline void budget_is_enforced(const factory& make) {
  constexpr uint64_t budget = 4ull << 20;
  auto dev = make(budget);
  CHECK_EQ(dev->hbm_budget(), budget);
  auto a = dev->allocate(3ull << 20);
  REQUIRE(a);
  CHECK_EQ(dev->bytes_allocated(), 3ull << 20);
  auto b = dev->allocate(2ull << 20);
  REQUIRE_FALSE(b);
  CHECK(b.error() == gpu_errc::budget_exceeded);
  CHECK_EQ(dev->bytes_allocated(), 3ull << 20); // refusal reserved nothing
  auto c = dev->allocate(1ull << 20);           // exactly to the budget
  REQUIRE(c);
  CHECK_EQ(dev->bytes_allocated(), budget);
  a->reset();
  CHECK_EQ(dev->bytes_allocated(), 1ull << 20);
  auto d = dev->allocate(2ull << 20);
  REQUIRE(d);
  {
    auto moved = std::move(*d); // moving transfers, does not double-count
    CHECK_FALSE(d->valid());
    CHECK_EQ(dev->bytes_allocated(), 3ull << 20);
  }
  CHECK_EQ(dev->bytes_allocated(), 1ull << 20);
  CHECK_EQ(dev->peak_bytes_allocated(), budget);
  auto zero = dev->allocate(0);
  CHECK(zero.error() == gpu_errc::invalid_argument);
  auto huge = dev->allocate(~size_t{0});
  CHECK(huge.error() == gpu_errc::budget_exceeded);
}

/// Bad arguments are errors, not crashes: out-of-bounds chunks, handles of
/// another device, empty handles.
inline void bad_arguments_are_errors(const factory& make) {
  auto dev = make(8ull << 20);
  auto other = make(8ull << 20);
  pinnable host(4096);
  auto pin = dev->pin(host.data(), host.size());
  REQUIRE(pin);
  auto buf = dev->allocate(1024);
  REQUIRE(buf);
  auto s = dev->make_stream();
  REQUIRE(s);
  auto err = dev->copy_h2d(*pin, *buf, {{0, 512, 513}}, *s);
  CHECK(err == gpu_errc::out_of_bounds);
  err = dev->copy_h2d(*pin, *buf, {{4000, 0, 100}}, *s);
  CHECK(err == gpu_errc::out_of_bounds);
  err = dev->copy_h2d(*pin, *buf, {{~size_t{0}, 0, 2}}, *s);
  CHECK(err == gpu_errc::out_of_bounds);
  err = dev->copy_d2h(*buf, *pin, {{0, 0, 1025}}, *s);
  CHECK(err == gpu_errc::out_of_bounds);
  auto sum = dev->checksum(*buf, 1000, 25, *s);
  CHECK(sum.error() == gpu_errc::out_of_bounds);
  auto foreign = other->allocate(1024);
  REQUIRE(foreign);
  err = dev->copy_h2d(*pin, *foreign, {{0, 0, 8}}, *s);
  CHECK(err == gpu_errc::invalid_handle);
  device_buffer empty;
  err = dev->copy_h2d(*pin, empty, {{0, 0, 8}}, *s);
  CHECK(err == gpu_errc::invalid_handle);
  stream no_stream;
  err = dev->copy_h2d(*pin, *buf, {{0, 0, 8}}, no_stream);
  CHECK(err == gpu_errc::invalid_handle);
  if (!dev->capabilities().batched_copy) {
    err = dev->copy_h2d(*pin, *buf, {{0, 0, 8}}, *s, copy_method::batched);
    CHECK(err == gpu_errc::unsupported);
  }
  // A valid copy still works after the refusals.
  CHECK(!dev->copy_h2d(*pin, *buf, {{0, 0, 1024}}, *s));
  CHECK(!dev->synchronize(*s));
}

/// notify(): the function runs after the work submitted before it (the
/// copied bytes are visible when it runs), never inline, exactly once; work
/// submitted after it still completes.
inline void notify_runs_after_work(const factory& make) {
  auto dev = make(256ull << 20);
  auto s = dev->make_stream();
  REQUIRE(s);
  auto ev = dev->make_event();
  REQUIRE(ev);
  round_trip trip{*dev, 64ull << 20, 21, *s};
  REQUIRE(!dev->record(*ev, *s));
  std::mutex mtx;
  std::condition_variable cv;
  int calls = 0;
  bool saw_bytes = false;
  auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  REQUIRE(!dev->notify(*ev, *s, [&] {
    std::lock_guard<std::mutex> guard{mtx};
    ++calls;
    ran_on = std::this_thread::get_id();
    saw_bytes = trip.back == trip.src;
    cv.notify_all();
  }));
  {
    std::unique_lock<std::mutex> guard{mtx};
    REQUIRE(cv.wait_for(guard, std::chrono::seconds(30),
                        [&] { return calls > 0; }));
  }
  REQUIRE(!dev->synchronize(*s));
  std::lock_guard<std::mutex> guard{mtx};
  CHECK_EQ(calls, 1);
  CHECK(saw_bytes);
  CHECK(ran_on != caller);
  // Bad arguments are errors, and the function is never called for them.
  event empty;
  CHECK(dev->notify(empty, *s, [&] { ++calls; }) == gpu_errc::invalid_handle);
  CHECK(dev->notify(*ev, *s, nullptr) == gpu_errc::invalid_argument);
  CHECK_EQ(calls, 1);
}

/// enqueue_checksums(): the checksum of every segment of a grid (a decode
/// slot's Layer Blocks: rows = layers, segments = blocks, a shorter last
/// block, an unaligned start) equals the host reference; only the results
/// come back; out-of-bounds grids and result areas are refused.
inline void segment_checksums_match(const factory& make) {
  auto dev = make(64ull << 20);
  constexpr size_t layers = 7;
  constexpr size_t tokens = 150; // 2 full blocks of 64 and one of 22
  constexpr size_t bpt = 13;     // odd: most segments start unaligned
  constexpr size_t offset = 3;
  constexpr size_t row = tokens * bpt;
  const size_t bytes = offset + layers * row;
  auto src = pattern(bytes, 31);
  auto pin = dev->pin(src.data(), src.size());
  REQUIRE(pin);
  auto buf = dev->allocate(bytes);
  REQUIRE(buf);
  auto s = dev->make_stream();
  REQUIRE(s);
  segment_grid grid{offset, layers, row, row, 64 * bpt};
  REQUIRE_EQ(grid.segments_per_row(), 3u);
  std::vector<uint64_t, page_allocator<uint64_t>> sums(grid.count() + 1, 0);
  const uint64_t sentinel = 0x5EC0DE5EC0DE5EC0ull;
  sums.back() = sentinel;
  auto out = dev->pin(sums.data(), sums.size() * sizeof(uint64_t));
  REQUIRE(out);
  auto done = dev->make_event();
  REQUIRE(done);
  REQUIRE(!dev->copy_h2d(*pin, *buf, {{0, 0, bytes}}, *s));
  REQUIRE(!dev->enqueue_checksums(*buf, grid, *out, 0, *s));
  REQUIRE(!dev->record(*done, *s));
  REQUIRE(!dev->synchronize(*done));
  for (size_t r = 0; r < layers; ++r)
    for (size_t k = 0; k < 3; ++k) {
      size_t first = offset + r * row + k * 64 * bpt;
      size_t len = std::min<size_t>(64 * bpt, row - k * 64 * bpt);
      CHECK_EQ(sums[r * 3 + k], block_checksum(src.data() + first, len));
    }
  CHECK_EQ(sums.back(), sentinel); // nothing written past the results
  // A changed byte changes exactly its segment's checksum.
  auto before = sums;
  src[offset + 2 * row + 64 * bpt + 5] ^= std::byte{1};
  REQUIRE(!dev->copy_h2d(*pin, *buf, {{0, 0, bytes}}, *s));
  REQUIRE(!dev->enqueue_checksums(*buf, grid, *out, 0, *s));
  REQUIRE(!dev->synchronize(*s));
  for (size_t i = 0; i < grid.count(); ++i) {
    if (i == 2 * 3 + 1)
      CHECK_NE(sums[i], before[i]);
    else
      CHECK_EQ(sums[i], before[i]);
  }
  auto too_long = grid;
  too_long.rows = layers + 1;
  CHECK(dev->enqueue_checksums(*buf, too_long, *out, 0, *s)
        == gpu_errc::out_of_bounds);
  CHECK(dev->enqueue_checksums(*buf, grid, *out, 16, *s)
        == gpu_errc::out_of_bounds);
  CHECK(dev->enqueue_checksums(*buf, grid, *out, 9, *s)
        == gpu_errc::out_of_bounds);
  auto small = grid;
  small.rows = 1;
  CHECK(dev->enqueue_checksums(*buf, small, *out, 4, *s)
        == gpu_errc::invalid_argument); // unaligned results
  CHECK(!dev->synchronize(*s));
}

/// The pool: allocations and frees call no backend while the pool has room
/// (no new slab, no host wait), buffers never overlap, freed ranges are
/// reused, and locate() names each buffer's slab and offset.
inline void pool_allocates_without_waits(const factory& make) {
  constexpr size_t layer = 3 * 4096 * 13; // not a multiple of 256
  auto dev = make(8 * layer);
  auto first = dev->allocate(layer);
  REQUIRE(first);
  auto base = dev->stats();
  CHECK_GE(base.slabs, 1u);
  std::vector<device_buffer> live;
  for (int cycle = 0; cycle < 1000; ++cycle) {
    auto b = dev->allocate(layer / 2 + static_cast<size_t>(cycle % 7) * 256);
    REQUIRE(b);
    live.push_back(std::move(*b));
    if (live.size() == 6)
      live.erase(live.begin(), live.begin() + 3);
  }
  auto after = dev->stats();
  CHECK_EQ(after.slabs, base.slabs);           // no backend allocation
  CHECK_EQ(after.host_waits, base.host_waits); // no synchronisation
  CHECK_EQ(after.allocations, base.allocations + 1000);
  // Live buffers are disjoint and inside their slab.
  std::vector<std::pair<const std::byte*, size_t>> ranges;
  ranges.emplace_back(first->data(), first->size());
  for (auto& b : live)
    ranges.emplace_back(b.data(), b.size());
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    CHECK(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first);
  auto slabs = dev->slabs();
  for (auto& b : live) {
    auto at = dev->locate(b);
    REQUIRE(at);
    REQUIRE(at->slab < slabs.size());
    CHECK_EQ(slabs[at->slab].base + at->offset, b.data());
    CHECK_LE(at->offset + b.size(), slabs[at->slab].size);
  }
  device_buffer none;
  CHECK(dev->locate(none).error() == gpu_errc::invalid_handle);
  // A freed range is handed out again (first fit: the lowest address).
  auto lowest = ranges.front().first;
  first->reset();
  live.clear();
  auto again = dev->allocate(layer);
  REQUIRE(again);
  CHECK_EQ(again->data(), lowest);
  CHECK_EQ(dev->stats().slabs, base.slabs);
}

/// The checks above that hold for every backend alike, one subcase each;
/// a suite runs them as one test case for its backend.
inline void every_backend_passes(const factory& make) {
  SUBCASE("scattered Layer Block rows copy byte-exact") {
    copies_are_byte_exact(make, copy_method::per_chunk);
  }
  SUBCASE("events complete after the work before them") {
    events_complete_after_work(make);
  }
  SUBCASE("the HBM budget refuses allocations beyond it") {
    budget_is_enforced(make);
  }
  SUBCASE("bad arguments are errors") {
    bad_arguments_are_errors(make);
  }
  SUBCASE("notify runs after the work") {
    notify_runs_after_work(make);
  }
  SUBCASE("segment checksums match the host reference") {
    segment_checksums_match(make);
  }
  SUBCASE("the pool allocates without backend calls or waits") {
    pool_allocates_without_waits(make);
  }
}

} // namespace dualpath::gpu::checks
