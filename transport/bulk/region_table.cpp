#include "transport/bulk/region_table.hpp"

#include <openssl/rand.h>

#include <random>

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

void region_table::remove(uint32_t id) {
  std::unique_lock<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i == slots_.end())
    return;
  i->second.removed = true;
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

void region_table::unpin(uint32_t id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = slots_.find(id);
  if (i != slots_.end() && --i->second.pins == 0)
    cv_.notify_all();
}

} // namespace dualpath::transport::bulk
