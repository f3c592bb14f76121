#include "actors/prefill_engine.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/decode_engine_actor.hpp"
#include "actors/engine_timing.hpp"
#include "actors/kv_layout.hpp"
#include "actors/layer_streamer.hpp"
#include "actors/scheduler_actor.hpp"
#include "gpu/device.hpp"

namespace dualpath::actors {

namespace {

using fetch_tick_atom = caf::atom_constant<caf::atom("petick")>;
constexpr auto fetch_tick_atom_v = fetch_tick_atom::value;

// One assignment on its way to the streamer.
struct pending_item {
  assignment a;
  read_plan plan;      // after plan_for
  read_plan effective; // after read errors
  std::vector<block_hash> hashes;
  decode_slot slot;
  bool admitted = false;
  bool pe_read_done = false;
  bool de_read_done = false;
  read_completion pe_read;
  read_completion de_read;
};

struct active_batch {
  uint64_t id = 0;
  work_batch work;
  caf::response_promise rp;
  std::vector<pending_item> items;
  size_t ready = 0;
  emulated_time::time_point started{};
  int64_t read_ns = 0;
  std::vector<uint64_t> leases; // to release after streaming
  bool failed = false;
};

struct prefill_state {
  engine_config cfg;
  std::shared_ptr<pe_staging> staging;
  layer_streamer_actor streamer;
  std::deque<std::pair<work_batch, caf::response_promise>> queue;
  std::unique_ptr<active_batch> batch;
  uint64_t next_batch = 1;
  // seq_e / tok_e: requests assigned here and not yet fully sent.
  uint32_t seq = 0;
  uint64_t tok = 0;
  bool fetching = false;
  static inline const char* name = "prefill_engine";
};

using self_ptr = caf::stateful_actor<prefill_state>*;

void next(self_ptr self);

void release_leases(self_ptr self, const std::vector<uint64_t>& leases) {
  auto& reader = self->state.cfg.node->reader;
  if (!reader)
    return;
  for (auto id : leases)
    self->send(reader, release_atom_v, id);
}

void end_batch(self_ptr self) {
  auto& st = self->state;
  auto& b = *st.batch;
  release_leases(self, b.leases);
  for (auto& x : b.work.items) {
    st.seq -= std::min<uint32_t>(st.seq, 1);
    st.tok -= std::min<uint64_t>(st.tok, x.request.tokens.size());
  }
  st.batch.reset();
  next(self);
}

void fail(self_ptr self, caf::error err) {
  auto& st = self->state;
  if (!st.batch || st.batch->failed)
    return;
  st.batch->failed = true;
  st.batch->rp.deliver(std::move(err));
  end_batch(self);
}

// Both reads of an item are in: decide its effective hits (the first failed
// or missing block and every later one become misses), tell the decode
// engine, and stream the batch once every item is ready.
void item_ready(self_ptr self, size_t index) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& it = b.items[index];
  const auto bt = cfg.model.block_tokens;
  uint32_t hit = it.plan.hit_blocks;
  auto first_failed = [&](const read_completion& c) {
    for (auto h : c.failed)
      for (uint32_t k = 0; k < it.plan.hit_blocks; ++k)
        if (it.hashes[k] == h)
          hit = std::min(hit, k);
  };
  first_failed(it.pe_read);
  first_failed(it.de_read);
  if (cfg.mode != load_mode::oracle) {
    // A PE-side block without a lease counts as failed as well.
    std::vector<bool> have(it.plan.pe_side_blocks, false);
    for (auto& l : it.pe_read.leases)
      if (l.block_index < have.size())
        have[l.block_index] = true;
    for (uint32_t k = 0; k < have.size(); ++k)
      if (!have[k])
        hit = std::min(hit, k);
  }
  uint64_t read_pe = 0;
  for (auto& l : it.pe_read.leases) {
    b.leases.push_back(l.lease_id);
    read_pe += uint64_t{bt} * cfg.model.layers
               * cfg.model.nominal_bytes_per_token_layer;
  }
  it.effective = read_plan{hit, std::min(it.plan.pe_side_blocks, hit)};
  self->send(
      caf::actor_cast<decode_engine_actor>(it.a.decode_actor), prefilled_atom_v,
      prefill_summary{it.a.request.id, hit, it.plan.hit_blocks - hit, read_pe});
  b.read_ns =
      std::max(b.read_ns, to_ns(emulated_now(self, cfg.time) - b.started));
  if (++b.ready < b.items.size())
    return;
  stream_plan plan;
  plan.batch_id = b.id;
  plan.layers = cfg.model.layers;
  plan.window = cfg.layer_window;
  for (auto& p : b.items) {
    stream_item s;
    s.request_id = p.a.request.id;
    s.tokens = static_cast<uint32_t>(p.a.request.tokens.size());
    s.hit_blocks = p.effective.hit_blocks;
    s.pe_side_blocks = p.effective.pe_side_blocks;
    s.miss_tokens = s.tokens - std::min(s.tokens, s.hit_blocks * bt);
    s.destination = p.slot.kv_buffer;
    s.decode_actor = p.a.decode_actor;
    s.hashes = p.hashes;
    for (auto& l : p.pe_read.leases)
      if (l.block_index < s.pe_side_blocks)
        s.hits.push_back(l);
    plan.items.push_back(std::move(s));
  }
  auto id = b.id;
  self->request(st.streamer, caf::infinite, stream_atom_v, std::move(plan))
      .then(
          [self, id](stream_report& rep) {
            auto& st = self->state;
            if (!st.batch || st.batch->id != id)
              return;
            if (!rep.layers.empty())
              rep.layers.front().read_ns = st.batch->read_ns;
            st.batch->rp.deliver(std::move(rep));
            end_batch(self);
          },
          [self, id](caf::error& err) {
            if (self->state.batch && self->state.batch->id == id)
              fail(self, std::move(err));
          });
}

void check_item(self_ptr self, size_t index) {
  auto& it = self->state.batch->items[index];
  if (it.admitted && it.pe_read_done && it.de_read_done)
    item_ready(self, index);
}

// DE side: the decode engine starts its read at admission, so its leases are
// asked for only once the request is admitted there (a `load` before the
// admission would find no request).
void request_de_read(self_ptr self, size_t index) {
  auto& st = self->state;
  auto& it = st.batch->items[index];
  auto id = st.batch->id;
  auto guard = [self, id] {
    return self->state.batch && self->state.batch->id == id;
  };
  auto de = caf::actor_cast<decode_engine_actor>(it.a.decode_actor);
  self->request(de, caf::infinite, load_atom_v, it.a.request.id)
      .then(
          [self, index, guard](read_completion& c) {
            if (!guard())
              return;
            auto& it = self->state.batch->items[index];
            it.de_read = std::move(c);
            it.de_read_done = true;
            check_item(self, index);
          },
          [self, guard](caf::error& err) {
            if (guard())
              fail(self, std::move(err));
          });
}

void start_item(self_ptr self, size_t index) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& b = *st.batch;
  auto& it = b.items[index];
  auto id = b.id;
  auto guard = [self, id] {
    return self->state.batch && self->state.batch->id == id;
  };
  auto de = caf::actor_cast<decode_engine_actor>(it.a.decode_actor);
  auto admitted = it.a;
  admitted.plan = it.plan;
  self->request(de, caf::infinite, admit_atom_v, std::move(admitted))
      .then(
          [self, index, guard](decode_slot& slot) {
            if (!guard())
              return;
            auto& it = self->state.batch->items[index];
            it.slot = std::move(slot);
            it.admitted = true;
            if (!it.de_read_done)
              request_de_read(self, index);
            check_item(self, index);
          },
          [self, guard](caf::error& err) {
            if (guard())
              fail(self, std::move(err));
          });
  const bool reads = cfg.mode != load_mode::oracle;
  // PE side.
  if (reads && it.plan.pe_side_blocks > 0 && cfg.node->reader) {
    read_request rr;
    rr.request_id = it.a.request.id;
    rr.blocks.assign(it.hashes.begin(),
                     it.hashes.begin() + it.plan.pe_side_blocks);
    rr.first_block = 0;
    rr.tokens = it.plan.pe_side_blocks * cfg.model.block_tokens;
    self->request(cfg.node->reader, caf::infinite, read_atom_v, std::move(rr))
        .then(
            [self, index, guard](read_completion& c) {
              if (!guard()) {
                std::vector<uint64_t> ids;
                for (auto& l : c.leases)
                  ids.push_back(l.lease_id);
                release_leases(self, ids);
                return;
              }
              auto& it = self->state.batch->items[index];
              it.pe_read = std::move(c);
              it.pe_read_done = true;
              check_item(self, index);
            },
            [self, guard](caf::error& err) {
              if (guard())
                fail(self, std::move(err));
            });
  } else {
    it.pe_read_done = true;
  }
  it.de_read_done = !(reads && it.plan.hit_blocks > it.plan.pe_side_blocks);
  check_item(self, index);
}

void next(self_ptr self) {
  auto& st = self->state;
  if (st.batch || st.queue.empty())
    return;
  auto [work, rp] = std::move(st.queue.front());
  st.queue.pop_front();
  auto& cfg = st.cfg;
  auto b = std::make_unique<active_batch>();
  b->id = st.next_batch++;
  b->rp = std::move(rp);
  b->started = emulated_now(self, cfg.time);
  for (auto& a : work.items) {
    pending_item it;
    it.a = a;
    it.hashes = prompt_block_hashes(a.request.tokens, cfg.model.block_tokens);
    uint32_t full =
        static_cast<uint32_t>(a.request.tokens.size() / cfg.model.block_tokens);
    it.plan = plan_for(cfg.mode, a.plan, full);
    b->items.push_back(std::move(it));
  }
  b->work = std::move(work);
  st.batch = std::move(b);
  if (st.batch->items.empty()) {
    st.batch->rp.deliver(stream_report{st.batch->id, {}, 0});
    end_batch(self);
    return;
  }
  for (size_t i = 0; i < st.batch->items.size() && st.batch; ++i)
    start_item(self, i);
}

engine_load own_load(self_ptr self) {
  auto& st = self->state;
  engine_load x;
  x.engine = st.cfg.id;
  x.seq = st.seq;
  x.tok = st.tok;
  x.free_hbm_bytes = free_hbm_nominal(st.cfg);
  return x;
}

caf::result<engine_load> status(self_ptr self) {
  return load_with_read_queue(self, [self] { return own_load(self); });
}

void schedule_fetch(self_ptr self) {
  auto& cfg = self->state.cfg;
  auto d = cfg.time.to_actor(std::chrono::nanoseconds(cfg.fetch_period_ns));
  self->delayed_send(self, d, fetch_tick_atom_v);
}

// Group leader: gather the members' loads, fetch work, dispatch it.
void fetch(self_ptr self) {
  auto& cfg = self->state.cfg;
  struct gather {
    group_report report;
    size_t left = 0;
  };
  auto g = std::make_shared<gather>();
  g->report.group = cfg.group;
  g->report.role = engine_role::prefill;
  auto me = caf::actor_cast<caf::actor>(self);
  std::vector<caf::actor> members;
  for (auto& m : cfg.group_members)
    if (m && m != me)
      members.push_back(m);
  g->left = members.size();
  auto done = [self, g] {
    auto& cfg = self->state.cfg;
    g->report.engines.insert(g->report.engines.begin(), own_load(self));
    auto sched = caf::actor_cast<scheduler_actor>(cfg.scheduler);
    self->request(sched, caf::infinite, fetch_atom_v, std::move(g->report))
        .then(
            [self](work_batch& w) {
              std::map<caf::actor, work_batch> per_member;
              for (auto& a : w.items)
                per_member[a.prefill_actor].items.push_back(std::move(a));
              for (auto& kv : per_member)
                if (kv.first)
                  self->request(kv.first, caf::infinite, prefill_atom_v,
                                std::move(kv.second))
                      .then([](stream_report&) {}, [](caf::error&) {});
              schedule_fetch(self);
            },
            [self](caf::error&) { schedule_fetch(self); });
  };
  if (members.empty()) {
    done();
    return;
  }
  for (auto& m : members)
    self->request(m, caf::infinite, status_atom_v)
        .then(
            [g, done](engine_load& x) {
              g->report.engines.push_back(std::move(x));
              if (--g->left == 0)
                done();
            },
            [g, done](caf::error&) {
              if (--g->left == 0)
                done();
            });
}

caf::behavior prefill_engine(self_ptr self, engine_config cfg) {
  auto staging = pe_staging::make(cfg);
  if (!staging) {
    self->quit(std::move(staging.error()));
    return {};
  }
  self->state.cfg = std::move(cfg);
  self->state.staging = *staging;
  self->state.streamer =
      spawn_layer_streamer(self->home_system(), self->state.cfg, *staging);
  self->link_to(self->state.streamer);
  auto& c = self->state.cfg;
  if (c.id.rank == 0 && !c.group_members.empty() && c.scheduler)
    schedule_fetch(self);
  return {
      [self](prefill_atom, work_batch& w) -> caf::result<stream_report> {
        auto& st = self->state;
        if (w.items.size() > 1) {
          // One request per batch: a batch holds its buffer leases and decode
          // slots until it has streamed, so batches of several requests can
          // wait on each other's reads and admissions across engines (a
          // deadlock once DRAM is full). Each request becomes its own batch
          // (through this handler) and the reply joins them.
          struct join_state {
            caf::typed_response_promise<stream_report> rp;
            stream_report rep;
            size_t left = 0;
            bool failed = false;
          };
          auto join = std::make_shared<join_state>();
          join->rp = self->make_response_promise<stream_report>();
          join->left = w.items.size();
          for (auto& a : w.items)
            self->request(caf::actor_cast<prefill_engine_actor>(self),
                          caf::infinite, prefill_atom_v, work_batch{{a}})
                .then(
                    [join](stream_report& r) {
                      join->rep.bytes_moved += r.bytes_moved;
                      join->rep.layers = std::move(r.layers);
                      if (--join->left == 0 && !join->failed)
                        join->rp.deliver(std::move(join->rep));
                    },
                    [join](caf::error& err) {
                      if (!join->failed) {
                        join->failed = true;
                        join->rp.deliver(std::move(err));
                      }
                    });
          return join->rp;
        }
        for (auto& a : w.items) {
          ++st.seq;
          st.tok += a.request.tokens.size();
        }
        auto rp = self->make_response_promise<stream_report>();
        st.queue.emplace_back(std::move(w), rp);
        next(self);
        return rp;
      },
      [self](status_atom) { return status(self); },
      [self](fetch_tick_atom) { fetch(self); },
  };
}

} // namespace

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

prefill_engine_actor spawn_prefill_engine(caf::actor_system& sys,
                                          engine_config cfg) {
  return caf::actor_cast<prefill_engine_actor>(
      sys.spawn(prefill_engine, std::move(cfg)));
}

} // namespace dualpath::actors
