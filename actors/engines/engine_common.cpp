#include "actors/engines/engine_common.hpp"

namespace dualpath::actors {

engine_load lane_load(const engine_config& cfg, uint32_t rank, uint32_t seq,
                      uint64_t tok, uint64_t free_hbm) {
  engine_load x;
  x.engine = cfg.id_of(rank);
  x.seq = seq;
  x.tok = tok;
  x.free_hbm_bytes = free_hbm;
  return x;
}

read_queue_status read_queue_of(const engine_config& cfg) {
  if (cfg.node && cfg.node->loads)
    return cfg.node->loads->read_queue();
  return {};
}

void span(const engine_config& cfg, const char* track, uint32_t rank,
          const char* name, uint64_t id, int32_t layer, int64_t begin_ns,
          int64_t end_ns, uint64_t nominal_bytes, const char* suffix) {
  if (!cfg.hooks || !cfg.hooks->tracing())
    return;
  cfg.hooks->span(
      observe::span_record{cfg.node ? cfg.node->name : std::string{},
                           track + std::to_string(rank) + suffix, name, id,
                           layer, begin_ns, end_ns, nominal_bytes});
}

read_completion failed_read(uint64_t request_id,
                            std::vector<block_hash> blocks) {
  read_completion c;
  c.request_id = request_id;
  c.failed = std::move(blocks);
  return c;
}

read_plan plan_for(load_mode mode, read_plan plan, uint32_t full_blocks) {
  plan.hit_blocks = std::min(plan.hit_blocks, full_blocks);
  plan.pe_side_blocks = std::min(plan.pe_side_blocks, plan.hit_blocks);
  switch (mode) {
    case load_mode::basic:
    case load_mode::layerwise:
      plan.pe_side_blocks = plan.hit_blocks;
      break;
    case load_mode::dualpath:
      break;
    case load_mode::oracle:
      plan.pe_side_blocks = 0;
      break;
  }
  return plan;
}

} // namespace dualpath::actors
