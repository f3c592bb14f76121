#include "transport/bulk/region_table.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <random>
#include <string>

namespace dualpath::transport::bulk {

uint64_t random_u64() {
  uint64_t x = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&x), sizeof(x)) != 1) {
    // The CSPRNG is unavailable: fall back to the OS entropy device.
    std::random_device rd;
    x = (uint64_t{rd()} << 32) | rd();
  }
  return x;
}

remote_region region_table::add(const std::string& node, void* ptr,
                                uint64_t len) {
  remote_region r;
  r.node = node;
  r.key = random_u64() | 1; // never 0: a zeroed descriptor never matches
  r.base = reinterpret_cast<uint64_t>(ptr);
  r.offset = 0;
  r.length = len;
  std::lock_guard<std::mutex> guard{mtx_};
  r.region_id = next_id_++;
  slots_[r.region_id].e = entry{static_cast<uint8_t*>(ptr), len, r.key};
  return r;
}

void region_table::remove(uint32_t id,
                          const std::function<void()>& while_pinned) {
  std::unique_lock<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i == slots_.end())
    return;
  i->second.removed = true;
  if (i->second.pins > 0 && while_pinned) {
    guard.unlock();
    while_pinned();
    guard.lock();
  }
  cv_.wait(guard, [&] { return slots_.at(id).pins == 0; });
  slots_.erase(id);
}

transport_errc region_table::acquire(uint32_t id, uint64_t key, uint64_t offset,
                                     uint64_t len, pin& out) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i == slots_.end() || i->second.removed)
    return transport_errc::unknown_region;
  auto& s = i->second;
  if (s.e.key != key)
    return transport_errc::wrong_key;
  if (offset > s.e.len || len > s.e.len - offset)
    return transport_errc::out_of_bounds;
  ++s.pins;
  auto e = s.e;
  e.ptr += offset;
  e.len = len;
  out = pin{this, id, e};
  return transport_errc::none;
}

transport_errc region_table::hold(uint32_t id, const void* base, pin& out) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i == slots_.end() || i->second.removed || i->second.e.ptr != base)
    return transport_errc::unknown_region;
  ++i->second.pins;
  out = pin{this, id, i->second.e};
  return transport_errc::none;
}

caf::expected<std::vector<region_table::pin>> hold_sources(region_table& table,
                                                           const batch& b) {
  std::vector<region_table::pin> held; // a batch has a few regions
  for (size_t i = 0; i < b.writes.size(); ++i) {
    const auto& src = *b.writes[i].source;
    if (std::any_of(held.begin(), held.end(),
                    [&](const auto& p) { return p.id() == src.id(); }))
      continue;
    region_table::pin p;
    if (table.hold(src.id(), src.data(), p) != transport_errc::none)
      return caf::make_error(transport_errc::unknown_region,
                             "write " + std::to_string(i)
                                 + ": its source (region "
                                 + std::to_string(src.id())
                                 + ") is not registered with this backend");
    held.push_back(std::move(p));
  }
  return held;
}

void region_table::unpin(uint32_t id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i != slots_.end() && --i->second.pins == 0)
    cv_.notify_all();
}

} // namespace dualpath::transport::bulk
