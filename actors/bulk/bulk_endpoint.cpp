#include "actors/bulk/bulk_endpoint.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace dualpath::actors {

namespace {

namespace bulk = transport::bulk;

// The interface plus the internal "batch `id` completed" message that backend
// threads send (the completion itself waits in the mailbox below).
using bulk_impl =
    bulk_endpoint_actor::extend<caf::reacts_to<done_atom, uint64_t>>;

/// Completions handed over from backend threads (thread-safe).
struct completion_box {
  std::mutex mtx;
  std::unordered_map<uint64_t, bulk::completion> ready;
};

struct bulk_state {
  std::shared_ptr<bulk::backend> backend;
  std::shared_ptr<region_directory> regions;
  std::shared_ptr<completion_box> box = std::make_shared<completion_box>();
  std::unordered_map<uint64_t, caf::typed_response_promise<batch_completion>>
      promises;
  uint64_t next_id = 1;
  static inline const char* name = "bulk_endpoint";
};

using self_ptr = bulk_impl::stateful_pointer<bulk_state>;

batch_completion to_message(const bulk::completion& c) {
  return batch_completion{c.tag, c.bytes, c.failed_ops, c.error};
}

endpoint_info describe(self_ptr self, const std::string& peer) {
  auto& be = *self->state.backend;
  endpoint_info info;
  info.node = be.node();
  info.backend = be.caps().name;
  if (auto d = be.details_for(peer)) {
    info.details = std::move(*d);
    if (info.backend == "tcp")
      info.address.assign(info.details.begin(), info.details.end());
  }
  return info;
}

bulk_impl::behavior_type endpoint(self_ptr self,
                                  std::shared_ptr<bulk::backend> backend,
                                  std::shared_ptr<region_directory> regions) {
  self->state.backend = std::move(backend);
  self->state.regions = std::move(regions);
  return {
      [=](connect_atom,
          const endpoint_info& peer) -> caf::result<endpoint_info> {
        auto& be = *self->state.backend;
        auto mine = be.details_for(peer.node);
        if (!mine)
          return mine.error();
        if (peer.details.empty())
          return describe(self, peer.node);
        // A backend's connect may wait for its handshake (verbs: up to a
        // few seconds for a slow or absent peer): it runs on a thread of its
        // own, so this endpoint keeps posting batches meanwhile and no
        // scheduler thread of the node is held.
        auto rp = self->make_response_promise<endpoint_info>();
        auto dialer = self->spawn<caf::detached>(
            [backend = self->state.backend](caf::event_based_actor* d) {
              return caf::behavior{
                  [backend, d](connect_atom,
                               const endpoint_info& to) -> caf::result<bool> {
                    auto answer = d->make_response_promise<bool>();
                    if (auto err = backend->connect(to.node, to.details))
                      answer.deliver(std::move(err));
                    else
                      answer.deliver(true);
                    d->quit(); // one connect per dialer
                    return answer;
                  },
              };
            });
        self->request(dialer, caf::infinite, connect_atom_v, peer)
            .then([=](bool) mutable { rp.deliver(describe(self, peer.node)); },
                  [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [=](describe_atom) { return describe(self, std::string{}); },
      [=](write_atom, const write_batch& wb) -> caf::result<batch_completion> {
        auto& st = self->state;
        bulk::batch b;
        b.tag = wb.tag;
        b.tclass = wb.tclass;
        if (wb.deadline_ns > 0)
          b.deadline = bulk::clock_type::now()
                       + std::chrono::nanoseconds{wb.deadline_ns};
        for (auto& op : wb.ops) {
          auto reg = st.regions->find(op.local_region);
          if (reg == nullptr)
            return batch_completion{
                wb.tag, 0, static_cast<uint32_t>(wb.ops.size()),
                caf::make_error(transport::transport_errc::unknown_region,
                                "no local region "
                                    + std::to_string(op.local_region))};
          b.writes.push_back(
              bulk::write_request{reg, op.local_offset, op.destination});
        }
        auto id = st.next_id++;
        auto promise = self->make_response_promise<batch_completion>();
        st.promises.emplace(id, promise);
        caf::weak_actor_ptr weak = caf::actor_cast<caf::weak_actor_ptr>(self);
        auto box = st.box;
        st.backend->post(std::move(b), [weak, box, id](bulk::completion c) {
          {
            std::lock_guard<std::mutex> guard{box->mtx};
            box->ready.emplace(id, std::move(c));
          }
          if (auto strong = weak.lock())
            caf::anon_send(caf::actor_cast<caf::actor>(strong), done_atom_v,
                           id);
        });
        return promise;
      },
      [=](done_atom, uint64_t id) {
        auto& st = self->state;
        bulk::completion c;
        {
          std::lock_guard<std::mutex> guard{st.box->mtx};
          auto i = st.box->ready.find(id);
          if (i == st.box->ready.end())
            return;
          c = std::move(i->second);
          st.box->ready.erase(i);
        }
        auto p = st.promises.find(id);
        if (p == st.promises.end())
          return;
        p->second.deliver(to_message(c));
        st.promises.erase(p);
      },
  };
}

} // namespace

bulk_endpoint_actor
spawn_bulk_endpoint(caf::actor_system& sys,
                    std::shared_ptr<transport::bulk::backend> backend,
                    std::shared_ptr<region_directory> regions) {
  auto impl = sys.spawn(endpoint, std::move(backend), std::move(regions));
  return caf::actor_cast<bulk_endpoint_actor>(impl);
}

} // namespace dualpath::actors
