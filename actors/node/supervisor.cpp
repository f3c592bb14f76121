#include "actors/node/supervisor.hpp"

#include <cstdlib>
#include <filesystem>

#include <caf/all.hpp>

#include "actors/node/node_system.hpp"
#include "actors/protocol/type_ids.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::actors::node {

namespace {

struct supervisor_state {
  static inline const char* name = "dualpath.supervisor";
  cluster_view view;
  std::string digest;
  std::string settings; // the scheduler node's, as deployment_settings()
};

using supervisor_ptr =
    node_supervisor_actor::stateful_pointer<supervisor_state>;

// Removes node `name` (not the supervisor's own, entry 0) from the view.
void drop_node(supervisor_ptr self, const std::string& name,
               const std::string& why) {
  auto& nodes = self->state.view.nodes;
  for (size_t i = 1; i < nodes.size(); ++i) {
    if (nodes[i].name != name)
      continue;
    nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(i));
    ++self->state.view.epoch;
    aout(self) << "dualpath node: node " << name << " left the cluster (" << why
               << ")" << std::endl;
    return;
  }
}

} // namespace

node_supervisor_actor spawn_supervisor(caf::actor_system& sys, node_info self,
                                       int64_t origin_unix_ns) {
  return sys.spawn([self, origin_unix_ns](supervisor_ptr me)
                       -> node_supervisor_actor::behavior_type {
    auto& s = me->state;
    s.digest = self.settings_digest;
    s.settings = self.settings;
    s.view.nodes.push_back(self);
    s.view.origin_unix_ns = origin_unix_ns;
    me->set_down_handler([me](const caf::down_msg& dm) {
      // Any actor of a node going down means the node is lost (its process
      // died or its link broke); its engines are re-queued by the
      // scheduler, which monitors them itself.
      std::string lost;
      for (auto& n : me->state.view.nodes)
        for (auto& a : n.actors)
          if (a && a.address() == dm.source)
            lost = n.name;
      if (!lost.empty())
        drop_node(me, lost, to_string(dm.reason));
    });
    return {
        [me](join_atom, node_info& info) -> caf::result<cluster_view> {
          auto& s = me->state;
          if (info.name.empty() || info.name == s.view.nodes.front().name)
            return caf::make_error(caf::sec::invalid_argument,
                                   "a joining node needs a name of its own");
          if (info.settings_digest != s.digest)
            return caf::make_error(
                caf::sec::invalid_argument,
                "node " + info.name + " runs with other settings than the "
                    + "scheduler node: "
                    + settings_difference(info.settings, s.settings,
                                          "on " + info.name,
                                          "on the scheduler node")
                    + " (digest " + info.settings_digest + " against "
                    + s.digest
                    + "): start every node with the same --config "
                      "and --set options");
          drop_node(me, info.name, "joined again");
          for (auto& a : info.actors)
            if (a)
              me->monitor(a);
          aout(me) << "dualpath node: node " << info.name << " joined ("
                   << info.engines.size() << " engines, bulk "
                   << info.endpoint.backend << " " << info.endpoint.address
                   << ")" << std::endl;
          s.view.nodes.push_back(std::move(info));
          ++s.view.epoch;
          return s.view;
        },
        [me](leave_atom, const std::string& name) {
          drop_node(me, name, "left on purpose");
        },
        [me](view_atom) { return me->state.view; },
    };
  });
}

uint32_t adopt_blocks(transport::storage::block_store& store,
                      const token_list& tokens, uint32_t block_tokens) {
  auto hashes = tokens.block_hashes(block_tokens);
  auto file_bytes = store.geometry().file_bytes();
  std::unique_ptr<std::byte, decltype(&std::free)> buf{nullptr, &std::free};
  uint32_t adopted = 0;
  transport::block_hash parent = transport::root_hash;
  for (auto h : hashes) {
    if (!store.contains(h)) {
      std::error_code ec;
      if (!std::filesystem::exists(store.path_of(h), ec))
        break;
      if (!buf)
        buf.reset(static_cast<std::byte*>(std::aligned_alloc(
            transport::storage::io_alignment,
            transport::storage::align_up(file_bytes,
                                         transport::storage::io_alignment))));
      // Read (verifying it) and write back through the store, which indexes
      // it; the rename keeps concurrent readers of the old file intact.
      if (!store.read_full(h, buf.get()))
        break;
      if (store.write(h, parent, buf.get()))
        break;
      ++adopted;
    }
    parent = h;
  }
  return adopted;
}

scheduler_actor
spawn_submit_gate(caf::actor_system& sys, scheduler_actor scheduler,
                  std::shared_ptr<transport::storage::block_store> store,
                  uint32_t block_tokens) {
  return sys.spawn([scheduler, store,
                    block_tokens](scheduler_actor::pointer self)
                       -> scheduler_actor::behavior_type {
    return {
        [=](submit_atom, request_spec& spec) -> caf::delegated<request_result> {
          adopt_blocks(*store, spec.tokens, block_tokens);
          return self->delegate(scheduler, submit_atom_v, std::move(spec));
        },
        [=](fetch_atom, group_report& rep) -> caf::delegated<work_batch> {
          return self->delegate(scheduler, fetch_atom_v, std::move(rep));
        },
        [=](report_atom, group_report& rep) {
          self->send(scheduler, report_atom_v, std::move(rep));
        },
        [=](enroll_atom, engine_registration& reg) -> caf::delegated<bool> {
          return self->delegate(scheduler, enroll_atom_v, std::move(reg));
        },
        [=](done_atom, request_result& res) {
          self->send(scheduler, done_atom_v, std::move(res));
        },
        [=](fail_atom, request_failure& f) {
          self->send(scheduler, fail_atom_v, std::move(f));
        },
    };
  });
}

} // namespace dualpath::actors::node
