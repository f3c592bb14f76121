#include "actors/engines/engine_common.hpp"

namespace dualpath::actors {

engine_load own_load_of(const engine_config& cfg, uint32_t seq, uint64_t tok) {
  engine_load x;
  x.engine = cfg.id;
  x.seq = seq;
  x.tok = tok;
  x.free_hbm_bytes = free_hbm_nominal(cfg);
  return x;
}

void span(const engine_config& cfg, const char* track, const char* name,
          uint64_t id, int32_t layer, int64_t begin_ns, int64_t end_ns,
          uint64_t nominal_bytes, const char* suffix) {
  if (!cfg.hooks || !cfg.hooks->tracing())
    return;
  cfg.hooks->span(observe::span_record{
      cfg.id.node, track + std::to_string(cfg.id.rank) + suffix, name, id,
      layer, begin_ns, end_ns, nominal_bytes});
}

read_completion failed_read(uint64_t request_id,
                            std::vector<block_hash> blocks) {
  read_completion c;
  c.request_id = request_id;
  c.failed = std::move(blocks);
  return c;
}

} // namespace dualpath::actors
