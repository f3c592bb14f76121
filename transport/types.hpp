// Shared value types of the transport module: block hashes, traffic classes and
// remote region descriptors. Everything here is a plain value type with
// inspect() beside it, so it can cross the network inside actor messages.
//
// Thread safety: value types, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>

namespace dualpath::transport {

/// Hash of a KV block: chained over (parent block hash, the block's token ids),
/// so equal hashes mean equal token prefixes (a trie of prefixes).
using block_hash = uint64_t;

/// The parent hash of the first block of every prompt.
constexpr block_hash root_hash = 0;

/// Traffic class of a bulk transfer. `control` is latency-sensitive model and
/// control traffic (the paper's high-priority lane); `kv` is bulk KV-cache
/// traffic (the low-priority lane).
enum class traffic_class : uint8_t {
  control = 0,
  kv = 1,
};

constexpr size_t traffic_class_count = 2;

std::string to_string(traffic_class x);

/// Parses "control" or "kv"; false on anything else.
bool from_string(std::string_view str, traffic_class& x);

/// A registered memory region of some node, as seen by a remote peer: the
/// copyable, serialisable half of a registration (the local half owns it).
/// `key` authorises writes into the region (the rkey for verbs, a random
/// 64-bit token for tcp/local). Offsets are relative to the region's start;
/// `base` is the region's address in the owner's address space (used by verbs).
struct remote_region {
  std::string node;       ///< Owning node's name.
  uint32_t region_id = 0; ///< Region id, unique per node.
  uint64_t key = 0;    ///< Access key checked by the owner before every write.
  uint64_t base = 0;   ///< Owner-side virtual address of byte 0.
  uint64_t offset = 0; ///< First byte of this view, relative to the region.
  uint64_t length = 0; ///< Bytes in this view.

  /// A view of `len` bytes starting `off` bytes into this view. Fails with
  /// `transport_errc::out_of_bounds` unless [off, off+len) lies inside this
  /// view (overflow-safe).
  caf::expected<remote_region> subrange(uint64_t off, uint64_t len) const;

  friend bool operator==(const remote_region& x, const remote_region& y) {
    return x.node == y.node && x.region_id == y.region_id && x.key == y.key
           && x.base == y.base && x.offset == y.offset && x.length == y.length;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remote_region& x) {
  return f(caf::meta::type_name("remote_region"), x.node, x.region_id, x.key,
           x.base, x.offset, x.length);
}

} // namespace dualpath::transport
