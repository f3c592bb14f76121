// The layer streamer: moves one prefill batch's KV layer by layer for a
// prefill engine, within a window of resident layers, and waits the emulated
// time of every step (see actors/engines/emulation.hpp: the real bytes are
// copied at once, the actor waits with delayed messages until the paced links
// and the compute model say the step is over). Per layer l:
//   1. allocate layer l's GPU memory for the batch ([request][token][bpt]);
//      PE-side hits: copy the Layer Blocks out of this node's reader leases
//      into the host staging, links PE dram + PE cnic_rx[rank] (CNIC-centric
//      H2D); DE-side hits: ask each decode engine to push its Layer Blocks
//      over the bulk transport (it reserves its own dram and cnic_tx, we
//      reserve cnic_rx[rank]) straight into the layer's GPU memory where
//      that is registered for RDMA (then order the writes before the
//      layer's compute reads them), else into the staging; then H2D staging
//      -> GPU memory;
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
// Copies host -> GPU are asynchronous: each layer's are followed by one
// event, and the device's completion notice (gpu::device::notify) is a
// message to the streamer, so no actor thread waits for a copy. A layer is
// loaded once its copies completed, and freed (its staging slot reused)
// only once the copies of its computed tokens completed too.
//
// Ownership: the staging (host memory mirroring the GPU's window, pinned
// with the device and registered with the node's bulk transport once) is
// shared with the prefill engine that owns the streamer.
// Thread safety: actor; the staging is used only by the streamer's actor and
// by bulk writes it requested.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/layer_streamer_actor.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::actors {

/// Host memory of one prefill engine mirroring its GPU window: allocated once
/// (real_bytes(hbm_bytes)), pinned with the device and registered with the
/// node's bulk transport once; plus the GPU memory itself registered for
/// RDMA where it can be (the device's first pool slab, which holds the whole
/// HBM budget): exported as dma-buf and registered as device memory (a CUDA
/// device and a bulk transport that takes it), or registered as host memory
/// (the host backend's stand-in). Layer Blocks pushed by decode engines then
/// land in GPU memory directly; otherwise they are staged here and copied
/// in (`direct` false, `staged_why` says why).
struct pe_staging {
  std::shared_ptr<gpu::device> device;
  gpu::host_memory memory; // pinned: whole pages of its own
  uint64_t size = 0;
  gpu::pinned_host pinned;
  gpu::stream stream;
  transport::bulk::local_registration registration;
  /// One event per layer in flight (window slot), made as needed: the
  /// streamer waits on it for the layer's H2D copies without blocking.
  std::vector<gpu::event> events;
  /// GPU memory (pool slab `device_slab`) registered for RDMA writes.
  transport::bulk::local_registration device_registration;
  size_t device_slab = 0;
  bool direct = false;
  std::string staged_why;

  static caf::expected<std::shared_ptr<pe_staging>>
  make(const engine_config& cfg);

  /// Waits for every copy the streamer submitted (teardown, failures).
  ~pe_staging();
};

layer_streamer_actor spawn_layer_streamer(caf::actor_system& sys,
                                          engine_config cfg,
                                          std::shared_ptr<pe_staging> staging);

} // namespace dualpath::actors
