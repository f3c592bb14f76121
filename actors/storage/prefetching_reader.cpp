#include "actors/storage/prefetching_reader.hpp"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_event_based_actor.hpp>

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefetch_atoms, settle_atom,
             "pfsettle")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefetch_atoms, tick_atom,
             "pftick")

namespace dualpath::actors {

namespace {

using namespace dualpath::actors::prefetch_atoms;

// Timer messages the reader sends itself.

using impl = storage_reader_actor::extend<
    // A chain (by its tail hash, at a persist generation) has settled.
    caf::reacts_to<settle_atom, block_hash, uint64_t>,
    // Periodic report to the observer.
    caf::reacts_to<tick_atom>>;

struct chain {
  std::vector<block_hash> blocks;
  uint64_t generation = 0; // bumped by every persist extending it
};

struct prefetch_state {
  storage_reader_actor inner;
  prefetch_config cfg;
  prefetch_stats stats;
  // Chains by their tail block.
  std::unordered_map<block_hash, std::shared_ptr<chain>> chains;
  // Kept leases by block, and their age order for eviction.
  std::unordered_map<block_hash, buffer_lease> kept;
  std::deque<block_hash> order;
  uint64_t next_generation = 1;
  static inline const char* name = "prefetching_reader";
};

using self_ptr = impl::stateful_pointer<prefetch_state>;

void keep(self_ptr self, buffer_lease lease) {
  auto& st = self->state;
  if (st.kept.count(lease.hash) != 0) {
    self->send(st.inner, release_atom_v, lease.lease_id); // a duplicate
    return;
  }
  st.order.push_back(lease.hash);
  st.kept.emplace(lease.hash, std::move(lease));
  while (st.kept.size() > st.cfg.max_blocks && !st.order.empty()) {
    auto oldest = st.order.front();
    st.order.pop_front();
    auto i = st.kept.find(oldest);
    if (i == st.kept.end())
      continue; // handed out already
    self->send(st.inner, release_atom_v, i->second.lease_id);
    st.kept.erase(i);
    ++st.stats.evicted;
  }
}

// Takes the kept lease of `hash` (if any) out of the cache.
std::optional<buffer_lease> take(self_ptr self, block_hash hash) {
  auto& st = self->state;
  auto i = st.kept.find(hash);
  if (i == st.kept.end())
    return std::nullopt;
  auto lease = std::move(i->second);
  st.kept.erase(i);
  return lease;
}

// Remembers the blocks of a read as a chain (keyed by its last block).
void learn(self_ptr self, const std::vector<block_hash>& blocks) {
  if (blocks.empty())
    return;
  auto c = std::make_shared<chain>();
  c->blocks = blocks;
  self->state.chains[blocks.back()] = std::move(c);
}

// A persisted block extends the chain whose tail is its parent.
void extend(self_ptr self, block_hash hash, block_hash parent) {
  auto& st = self->state;
  auto i = st.chains.find(parent);
  std::shared_ptr<chain> c;
  if (i != st.chains.end()) {
    c = i->second;
    st.chains.erase(i);
  } else {
    c = std::make_shared<chain>();
  }
  c->blocks.push_back(hash);
  c->generation = st.next_generation++;
  st.chains[hash] = c;
  self->delayed_send(self, st.cfg.settle, settle_atom_v, hash, c->generation);
}

// Reads the tail of a settled chain ahead of the agent's next turn.
void prefetch(self_ptr self, const chain& c) {
  auto& st = self->state;
  read_request req;
  auto first = c.blocks.size() > st.cfg.per_chain
                   ? c.blocks.size() - st.cfg.per_chain
                   : 0;
  for (auto k = first; k < c.blocks.size(); ++k)
    if (st.kept.count(c.blocks[k]) == 0)
      req.blocks.push_back(c.blocks[k]);
  if (req.blocks.empty())
    return;
  req.first_block = static_cast<uint32_t>(first);
  self->request(st.inner, caf::infinite, read_atom_v, std::move(req))
      .then(
          [self](read_completion& done) {
            for (auto& lease : done.leases) {
              ++self->state.stats.prefetched;
              keep(self, std::move(lease));
            }
          },
          [](caf::error&) {
            // A failed prefetch is no error: the next turn reads as usual.
          });
}

void report(self_ptr self) {
  auto& st = self->state;
  if (!st.cfg.observer)
    return;
  st.stats.kept = st.kept.size();
  state_snapshot s;
  s.source = "prefetch." + st.cfg.node;
  s.at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                self->clock().now().time_since_epoch())
                .count();
  s.samples = {
      {"dualpath_prefetch_blocks_total", double(st.stats.prefetched)},
      {"dualpath_prefetch_hits_total", double(st.stats.hits)},
      {"dualpath_prefetch_misses_total", double(st.stats.misses)},
      {"dualpath_prefetch_evicted_total", double(st.stats.evicted)},
      {"dualpath_prefetch_kept_blocks", double(st.stats.kept)},
  };
  self->send(st.cfg.observer, snapshot_atom_v, std::move(s));
}

impl::behavior_type prefetching_reader(self_ptr self,
                                       storage_reader_actor inner,
                                       prefetch_config cfg) {
  auto& st = self->state;
  st.inner = std::move(inner);
  st.cfg = std::move(cfg);
  st.cfg.max_blocks = std::max<uint32_t>(st.cfg.max_blocks, 1);
  // The node's reader lives and dies with this one (its pool, and with it
  // every kept lease, goes with it).
  self->link_to(st.inner);
  if (st.cfg.observer && st.cfg.report_period.count() > 0)
    self->delayed_send(self, st.cfg.report_period, tick_atom_v);
  return {
      [self](read_atom, read_request& req) -> caf::result<read_completion> {
        auto& st = self->state;
        learn(self, req.blocks);
        // Kept blocks are served now; the others are read as usual.
        read_completion done;
        done.request_id = req.request_id;
        read_request rest;
        rest.request_id = req.request_id;
        std::unordered_map<block_hash, uint32_t> index;
        for (size_t k = 0; k < req.blocks.size(); ++k) {
          auto b = static_cast<uint32_t>(req.first_block + k);
          if (auto lease = take(self, req.blocks[k])) {
            lease->block_index = b;
            done.leases.push_back(std::move(*lease));
            ++st.stats.hits;
          } else {
            rest.blocks.push_back(req.blocks[k]);
            index.emplace(req.blocks[k], b);
            ++st.stats.misses;
          }
        }
        if (rest.blocks.empty())
          return done;
        rest.tokens = static_cast<uint32_t>(
            uint64_t{req.tokens} * rest.blocks.size() / req.blocks.size());
        auto rp = self->make_response_promise<read_completion>();
        self->request(st.inner, caf::infinite, read_atom_v, std::move(rest))
            .then(
                [rp, done, index](read_completion& got) mutable {
                  for (auto& lease : got.leases) {
                    lease.block_index = index.at(lease.hash);
                    done.leases.push_back(std::move(lease));
                  }
                  done.failed = std::move(got.failed);
                  done.why_failed = std::move(got.why_failed);
                  std::sort(done.leases.begin(), done.leases.end(),
                            [](auto& a, auto& b) {
                              return a.block_index < b.block_index;
                            });
                  rp.deliver(std::move(done));
                },
                [self, rp, done](caf::error& err) mutable {
                  // Hand the kept leases back before failing the read.
                  for (auto& lease : done.leases)
                    self->send(self->state.inner, release_atom_v,
                               lease.lease_id);
                  rp.deliver(std::move(err));
                });
        return rp;
      },
      [self](reserve_atom,
             reserve_request& req) -> caf::result<read_completion> {
        // Reservations are the inner reader's (the prefetcher keeps none).
        return self->delegate(self->state.inner, reserve_atom_v,
                              std::move(req));
      },
      [self](release_atom, uint64_t lease_id) {
        self->send(self->state.inner, release_atom_v, lease_id);
      },
      [self](release_atom, lease_release& r) {
        self->send(self->state.inner, release_atom_v, std::move(r));
      },
      [self](persist_atom, persist_request& req) -> caf::result<block_hash> {
        // The chain grows once the block is durable (a prefetch can read
        // it then).
        auto rp = self->make_response_promise<block_hash>();
        self->request(self->state.inner, caf::infinite, persist_atom_v, req)
            .then(
                [self, rp, req](block_hash h) mutable {
                  extend(self, req.hash, req.parent);
                  rp.deliver(h);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](persist_atom, persist_batch& req) -> caf::result<uint32_t> {
        auto rp = self->make_response_promise<uint32_t>();
        self->request(self->state.inner, caf::infinite, persist_atom_v, req)
            .then(
                [self, rp, req](uint32_t written) mutable {
                  // Each written block extends its chain, as one persist.
                  auto parent = req.parent;
                  for (uint32_t k = 0; k < written && k < req.hashes.size();
                       ++k) {
                    extend(self, req.hashes[k], parent);
                    parent = req.hashes[k];
                  }
                  rp.deliver(written);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](queue_atom) -> caf::result<read_queue_status> {
        return self->delegate(self->state.inner, queue_atom_v);
      },
      [self](settle_atom, block_hash tail, uint64_t generation) {
        auto& st = self->state;
        auto i = st.chains.find(tail);
        if (i == st.chains.end() || i->second->generation != generation)
          return; // extended since: wait for the later settle
        prefetch(self, *i->second);
      },
      [self](tick_atom) {
        report(self);
        self->delayed_send(self, self->state.cfg.report_period, tick_atom_v);
      },
  };
}

} // namespace

storage_reader_actor spawn_prefetching_reader(caf::actor_system& sys,
                                              storage_reader_actor inner,
                                              prefetch_config cfg) {
  auto hdl = sys.spawn(prefetching_reader, std::move(inner), std::move(cfg));
  return caf::actor_cast<storage_reader_actor>(hdl);
}

} // namespace dualpath::actors
