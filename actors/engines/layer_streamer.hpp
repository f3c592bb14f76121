// The layer streamer: moves one prefill batch's KV layer by layer for a
// prefill engine, within a window of resident layers, and waits the emulated
// time of every step (see actors/engines/emulation.hpp: the real bytes are
// copied at once, the actor waits with delayed messages until the paced links
// and the compute model say the step is over). Per layer l:
//   1. allocate layer l's GPU memory for the batch ([request][token][bpt]);
//      PE-side hits: copy the Layer Blocks out of this node's reader leases
//      into the host staging, links PE dram + PE cnic_rx[rank] (CNIC-centric
//      H2D); DE-side hits: ask each decode engine to push its Layer Blocks
//      into the staging over the bulk transport (it reserves its own dram and
//      cnic_tx, we reserve cnic_rx[rank]); then H2D staging -> GPU memory;
//   2. compute layer l (compute model, after layer l-1): fill the miss
//      tokens' KV with the deterministic content and H2D it;
//   3. send layer l's KV to each decode slot over the bulk transport, class
//      kv (PE-side hits + misses; DE-side hits stay where they are), link
//      PE cnic_tx[rank]; notify the decode engine (layer_ready); free layer
//      l's GPU memory, admitting layer l + window.
// Basic mode is the same data flow with window = layers and two barriers:
// compute starts once every layer is resident, sending once every layer is
// computed. Oracle moves nothing: compute time only, layer_ready with 0 bytes.
//
// The streamer serves one batch at a time (later ones queue). It is an
// untyped actor behind the typed handle so that it can send itself timer
// messages; only the layer_streamer_actor interface is public.
//
// Ownership: the staging (host memory standing in for the GPU's registered
// window, pinned with the device and registered with the node's bulk
// transport once) is shared with the prefill engine that owns the streamer.
// Thread safety: actor; the staging is used only by the streamer's actor and
// by bulk writes it requested.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/layer_streamer_actor.hpp"
#include "gpu/device.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::actors {

/// Host memory of one prefill engine mirroring its GPU window: allocated once
/// (real_bytes(hbm_bytes)), pinned with the device and registered with the
/// node's bulk transport once.
struct pe_staging {
  std::unique_ptr<std::byte[]> memory;
  uint64_t size = 0;
  gpu::pinned_host pinned;
  gpu::stream stream;
  transport::bulk::local_registration registration;

  static caf::expected<std::shared_ptr<pe_staging>>
  make(const engine_config& cfg);
};

layer_streamer_actor spawn_layer_streamer(caf::actor_system& sys,
                                          engine_config cfg,
                                          std::shared_ptr<pe_staging> staging);

} // namespace dualpath::actors
