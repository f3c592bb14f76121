// Checks every gpu::device backend must pass, shared by the host suite
// (tests/gpu/host_device.cpp) and the cuda suite (tests/gpu/cuda_device.cpp)
// so both backends are held to the same behaviour. Each function takes a
// device factory (options -> device) so budgets can be set per check.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/device.hpp"

namespace dualpath::gpu::checks {

using factory = std::function<std::shared_ptr<device>(uint64_t budget)>;

/// Deterministic bytes (a Layer Block stand-in): a function of seed and index.
inline std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
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
  std::vector<std::byte> back(bytes, std::byte{0});
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
  constexpr size_t bytes = 128ull << 20;
  auto src = pattern(bytes, 3);
  std::vector<std::byte> back(bytes);
  auto src_pin = dev->pin(src.data(), bytes);
  auto back_pin = dev->pin(back.data(), bytes);
  REQUIRE(src_pin);
  REQUIRE(back_pin);
  auto buf = dev->allocate(bytes);
  REQUIRE(buf);
  std::vector<copy_chunk> whole{{0, 0, bytes}};
  REQUIRE(!dev->copy_h2d(*src_pin, *buf, whole, *s));
  REQUIRE(!dev->copy_d2h(*buf, *back_pin, whole, *s));
  REQUIRE(!dev->record(*ev, *s));
  // Poll like an engine would: query until complete (bounded).
  caf::expected<bool> q{false};
  for (int i = 0; i < 100000000 && q && !*q; ++i)
    q = dev->query(*ev);
  REQUIRE(q);
  CHECK(*q);
  CHECK(back == src);
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
  std::vector<std::byte> host(4096);
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

} // namespace dualpath::gpu::checks
