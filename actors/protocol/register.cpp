#include "actors/protocol/register.hpp"

#include <string>
#include <vector>

#include "actors/protocol/type_ids.hpp"
#include "config/errors.hpp"
#include "gpu/errors.hpp"
#include "scheduler/workload/errors.hpp"
#include "transport/errors.hpp"
#include "transport/storage/errors.hpp"
#include "transport/type_ids.hpp"

// Every type-ID block lies at its own fixed offset (transport 200, actors
// 450); they must not overlap (CAF allows gaps).
static_assert(caf::id_block::dualpath_transport::end
                  <= caf::id_block::dualpath_actors::begin,
              "transport block overflows into the actors' range");
static_assert(caf::id_block::dualpath_actors::begin == 450
                  && caf::id_block::dualpath_actors::end <= 600,
              "actors block out of its range");

namespace dualpath::actors {

namespace {

template <class Block, caf::type_id_t... Is>
void collect_names(std::vector<std::string>& out,
                   std::integer_sequence<caf::type_id_t, Is...>) {
  (out.emplace_back(caf::type_name_by_id<Block::begin + Is>::value), ...);
}

template <class Block>
void collect_names(std::vector<std::string>& out) {
  collect_names<Block>(
      out,
      std::make_integer_sequence<caf::type_id_t, Block::end - Block::begin>{});
}

} // namespace

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::dualpath_transport>();
  cfg.add_message_types<caf::id_block::dualpath_actors>();
  transport::add_error_category(cfg);
  transport::storage::add_error_category(cfg);
  gpu::add_error_category(cfg);
  config::add_error_category(cfg);
  scheduler::workload::add_error_category(cfg);
}

std::string render(const caf::error& err) {
  if (!err)
    return "no error";
  static const auto renderers = [] {
    caf::actor_system_config cfg;
    add_message_types(cfg);
    return cfg.error_renderers;
  }();
  auto i = renderers.find(err.category());
  if (i != renderers.end())
    return i->second(err.code(), err.category(), err.context());
  return caf::actor_system_config::render(err);
}

std::vector<std::string> registered_type_names() {
  std::vector<std::string> result;
  collect_names<caf::id_block::dualpath_transport>(result);
  collect_names<caf::id_block::dualpath_actors>(result);
  return result;
}

} // namespace dualpath::actors
