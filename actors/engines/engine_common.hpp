// What the prefill and the decode engine share beyond timing
// (engine_timing.hpp): the byte units of an engine's model, whether its mode
// moves KV, one GPU's load report, the node's read queue, timeline spans on
// its tracks, and a storage read whose failure as a whole turns every block
// into a miss.
//
// Thread safety: pure functions of the config, or called from the engine
// actor's own thread (span, read_blocks).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>

#include "actors/engines/engine_context.hpp"
#include "actors/engines/engine_timing.hpp"
#include "actors/observe/hooks.hpp"

namespace dualpath::actors {

/// Real KV bytes per token per layer: the unit of the block store, the
/// decode slot and every real copy.
inline uint64_t bpt(const engine_config& cfg) {
  return cfg.model.real_bytes_per_token_layer;
}

/// Whether the engine's mode moves KV at all (timing and links); Oracle
/// assumes it resident.
inline bool moves_bytes(const engine_config& cfg) {
  return cfg.mode != load_mode::oracle;
}

/// Whether real bytes are copied too (not on a modeled data plane).
inline bool copies_bytes(const engine_config& cfg) {
  return moves_bytes(cfg) && cfg.real_bytes;
}

/// The read plan both engines apply in `mode` to the scheduler's plan `plan`
/// for a prompt with `full_blocks` full blocks: basic and layerwise read
/// every hit on the prefill side, dualpath as planned, oracle nothing.
read_plan plan_for(load_mode mode, read_plan plan, uint32_t full_blocks);

/// The load of GPU `rank` of the engine's node: seq_e, tok_e and the HBM it
/// has free for KV (nominal bytes); the node's read queue is added where a
/// report needs it (read_queue_of).
engine_load lane_load(const engine_config& cfg, uint32_t rank, uint32_t seq,
                      uint64_t tok, uint64_t free_hbm);

/// The node's storage read queue as its reader last published it (empty
/// without a load board).
read_queue_status read_queue_of(const engine_config& cfg);

/// Records a span of request `id` on track `track` + `rank` + `suffix` of
/// the engine's node ("gpu0", "cnic1 rx"); nothing unless the run is traced.
void span(const engine_config& cfg, const char* track, uint32_t rank,
          const char* name, uint64_t id, int32_t layer, int64_t begin_ns,
          int64_t end_ns, uint64_t nominal_bytes = 0, const char* suffix = "");

/// The outcome of a read that failed as a whole (the reader did not
/// answer): every block failed and is recomputed, as single failed blocks
/// are.
read_completion failed_read(uint64_t request_id,
                            std::vector<block_hash> blocks);

/// Sends `rr` to the node's reader; `done` gets the read's completion, or
/// failed_read() of its blocks when the reader fails as a whole.
template <class Self, class Done>
void read_blocks(Self* self, const storage_reader_actor& reader,
                 read_request rr, Done done) {
  auto id = rr.request_id;
  auto blocks = rr.blocks;
  self->request(reader, caf::infinite, read_atom_v, std::move(rr))
      .then([done](read_completion& c) mutable { done(std::move(c)); },
            [done, id, blocks = std::move(blocks)](caf::error&) mutable {
              done(failed_read(id, std::move(blocks)));
            });
}

} // namespace dualpath::actors
