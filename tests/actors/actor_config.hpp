// What the actor suites share: an actor system configuration with dualpath's
// message types (on CAF's test coordinator when the suite runs in simulated
// time), a fresh block store, and the byte-exact check of a block a storage
// reader leased.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include "actors/protocol/messages.hpp"
#include "actors/protocol/register.hpp"
#include "tests/support/support.hpp"
#include "transport/storage/backend.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::test {

/// dualpath's message types registered; `policy` is CAF's scheduler policy
/// ("sharing", or "testing": the test coordinator, simulated time), CAF's
/// default when empty.
struct actor_config : caf::actor_system_config {
  explicit actor_config(const std::string& policy = "") {
    actors::add_message_types(*this);
    if (!policy.empty())
      set("scheduler.policy", caf::atom_from_string(policy));
  }
};

/// An empty block store of model "m" with geometry `geo` in `dir`, on the
/// automatic backend with `queue_depth` reads in flight.
inline std::shared_ptr<transport::storage::block_store>
open_store(const temp_dir& dir, const transport::storage::kv_geometry& geo,
           uint32_t queue_depth) {
  namespace storage = transport::storage;
  auto backend = storage::make_backend(
      storage::backend_config{storage::backend_kind::automatic, queue_depth});
  REQUIRE(backend);
  auto store = storage::block_store::open(
      storage::store_config{dir.path(), "m", geo}, std::move(*backend));
  REQUIRE(store);
  return std::move(*store);
}

/// Whether every layer of the block `l` leases from `pool` holds the block's
/// deterministic KV (transport/storage/kv_content.hpp).
inline bool layers_exact(const actors::buffer_lease& l,
                         const transport::storage::buffer_pool& pool,
                         const transport::storage::kv_geometry& geo) {
  auto* p = pool.base() + l.region.offset;
  for (uint32_t layer = 0; layer < geo.layers; ++layer)
    if (!transport::storage::kv_check_layer(l.hash, layer, geo.block_tokens,
                                            geo.bytes_per_token_layer,
                                            p + layer * geo.layer_bytes()))
      return false;
  return true;
}

} // namespace dualpath::test
