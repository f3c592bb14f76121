#include "actors/engines/prefill/prefill_engine.hpp"

#include <algorithm>
#include <optional>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include "actors/engines/kv_layout.hpp"
#include "actors/engines/prefill/packing.hpp"
#include "actors/engines/prefill/prefill_state.hpp"
#include "actors/engines/streamer/layer_streamer.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "transport/storage/buffer_pool.hpp"

namespace dualpath::actors::prefill {

namespace {

uint64_t kv_bytes_per_token(const engine_config& cfg) {
  return cfg.model.nominal_bytes_per_token_layer * cfg.model.layers;
}

void release_leases(self_ptr self, std::vector<uint64_t> ids) {
  auto& reader = self->state.cfg.node->reader;
  if (reader && !ids.empty())
    self->send(reader, release_atom_v, lease_release{std::move(ids)});
}

// A request leaves the engine: its leases go back, its GPU forgets it.
void remove_job(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.jobs.find(id);
  if (i == st.jobs.end())
    return;
  auto& j = i->second;
  auto& lane = st.lanes[j.lane];
  lane.fifo.erase(std::remove(lane.fifo.begin(), lane.fifo.end(), id),
                  lane.fifo.end());
  lane.seq -= std::min<uint32_t>(lane.seq, 1);
  lane.tok -= std::min<uint64_t>(lane.tok, j.tokens);
  std::vector<uint64_t> ids = std::move(j.leases);
  for (auto& l : j.pe_read.leases)
    ids.push_back(l.lease_id);
  st.jobs.erase(i);
  release_leases(self, std::move(ids));
}

// The scheduler's cost of a request for the admissions ahead: what the
// GPU's packing counts against its budget.
double cost(const engine_config& cfg, const pe_job& j) {
  // Before admission the hits are the plan's (read errors may shrink them).
  uint32_t cached = j.phase < pe_phase::ready
                        ? j.plan.hit_blocks * cfg.model.block_tokens
                        : j.done_tokens;
  cached = std::min(cached, j.tokens);
  auto remaining = j.tokens - cached;
  if (cfg.packing == batching::quota)
    return attention_seconds(cfg, gpu::sequence_shape{cached, remaining});
  return static_cast<double>(remaining);
}

double budget(const engine_config& cfg) {
  return cfg.packing == batching::quota ? cfg.quota_s
                                        : static_cast<double>(cfg.batch_tokens);
}

void on_slot(self_ptr self, uint64_t id, decode_slot slot);

// Asks the decode node for the slots of the requests that the GPU's next
// two batches may hold: its queued requests in FIFO order while the ready
// and admitting ones ahead cost less than twice the GPU's budget.
void admit_ahead(self_ptr self, pe_lane& lane) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  double ahead = 0;
  for (auto id : lane.fifo) {
    if (ahead >= 2 * budget(cfg))
      return;
    auto& j = st.jobs.at(id);
    switch (j.phase) {
      case pe_phase::reading:
        continue; // its read is not in: the KV is not needed yet
      case pe_phase::queued: {
        j.phase = pe_phase::admitting;
        auto de = caf::actor_cast<decode_engine_actor>(j.a.decode_actor);
        self->request(de, caf::infinite, admit_atom_v, j.a)
            .then(
                [self, id](decode_slot& slot) {
                  on_slot(self, id, std::move(slot));
                },
                [self, id](caf::error& err) { fail_job(self, id, err); });
        break;
      }
      default:
        break;
    }
    ahead += cost(cfg, j);
  }
}

// The slot is in: the hits the request uses (the first failed or missing
// hit block and every later one become misses), the decode node told.
void on_slot(self_ptr self, uint64_t id, decode_slot slot) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.jobs.find(id);
  if (i == st.jobs.end() || i->second.phase != pe_phase::admitting)
    return;
  auto& j = i->second;
  const auto bt = cfg.model.block_tokens;
  uint32_t hit = j.plan.hit_blocks;
  auto first_failed = [&](const std::vector<block_hash>& failed) {
    for (auto h : failed)
      for (uint32_t k = 0; k < j.plan.hit_blocks; ++k)
        if (j.hashes[k] == h)
          hit = std::min(hit, k);
  };
  first_failed(j.pe_read.failed);
  first_failed(slot.failed);
  if (moves_bytes(cfg)) {
    // A PE-side block without a lease counts as failed as well.
    std::vector<bool> have(j.plan.pe_side_blocks, false);
    for (auto& l : j.pe_read.leases)
      for (uint64_t b = l.block_index;
           b < std::min<uint64_t>(uint64_t{l.block_index} + l.blocks,
                                  have.size());
           ++b)
        have[b] = true;
    for (uint32_t k = 0; k < have.size(); ++k)
      if (!have[k])
        hit = std::min(hit, k);
  }
  uint32_t pe_side = std::min(j.plan.pe_side_blocks, hit);
  j.hit_tokens = hit * bt;
  j.pe_side_tokens = pe_side * bt;
  j.done_tokens = j.hit_tokens;
  // The leases of PE-side blocks past the hits used are not needed.
  std::vector<uint64_t> unused;
  std::vector<buffer_lease> kept;
  for (auto& l : j.pe_read.leases) {
    if (l.blocks == 1 && l.block_index >= pe_side) {
      unused.push_back(l.lease_id);
      continue;
    }
    j.bytes_read_pe += uint64_t{bt} * l.blocks * kv_bytes_per_token(cfg);
    if (cfg.real_bytes && l.block_index < pe_side)
      j.pe_blocks.push_back(l);
    j.leases.push_back(l.lease_id);
  }
  j.pe_read.leases.clear();
  release_leases(self, std::move(unused));
  j.slot = std::move(slot);
  j.phase = pe_phase::ready;
  self->send(
      caf::actor_cast<decode_engine_actor>(j.a.decode_actor), prefilled_atom_v,
      prefill_summary{j.id, hit, j.plan.hit_blocks - hit, j.bytes_read_pe,
                      pe_side, j.pe_read.waited_for_buffer ? 1u : 0u,
                      j.control_rtt_ns});
  pump(self);
}

void on_read(self_ptr self, uint64_t id, read_completion c) {
  auto& st = self->state;
  auto i = st.jobs.find(id);
  if (i == st.jobs.end() || i->second.phase != pe_phase::reading) {
    std::vector<uint64_t> ids;
    for (auto& l : c.leases)
      ids.push_back(l.lease_id);
    release_leases(self, std::move(ids));
    return;
  }
  i->second.pe_read = std::move(c);
  i->second.phase = pe_phase::queued;
  pump(self);
}

// Requests the scheduler placed on this node's GPUs: their PE-side reads go
// to the node's reader now, in placement order.
// `rtt_ns`: the round trip of the fetch whose reply `w` is (-1: pushed).
void on_assigned(self_ptr self, work_batch& w, int64_t rtt_ns) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto now = emulated_now(self, cfg.time);
  for (auto& a : w.items) {
    auto id = a.request.id;
    if (st.jobs.count(id) != 0)
      continue; // a duplicate dispatch: the first one counts
    auto& j = st.jobs[id];
    j.id = id;
    j.lane = std::min(a.prefill.rank, cfg.gpus - 1);
    j.tokens = static_cast<uint32_t>(a.request.tokens.size());
    j.hashes = prompt_block_hashes(a.request.tokens, cfg.model.block_tokens);
    auto full = j.tokens / cfg.model.block_tokens;
    j.plan = plan_for(cfg.mode, a.plan, full);
    j.placed_at = now;
    j.control_rtt_ns = rtt_ns;
    j.a = std::move(a);
    auto& lane = st.lanes[j.lane];
    lane.fifo.push_back(id);
    ++lane.seq;
    lane.tok += j.tokens;
    if (moves_bytes(cfg) && j.plan.pe_side_blocks > 0 && cfg.node->reader) {
      j.phase = pe_phase::reading;
      read_request rr;
      rr.request_id = id;
      rr.blocks.assign(j.hashes.begin(),
                       j.hashes.begin() + j.plan.pe_side_blocks);
      rr.first_block = 0;
      rr.tokens = j.plan.pe_side_blocks * cfg.model.block_tokens;
      read_blocks(
          self, cfg.node->reader, std::move(rr),
          [self, id](read_completion c) { on_read(self, id, std::move(c)); });
    } else {
      j.phase = pe_phase::queued;
    }
  }
  pump(self);
}

// Whether the running step is loaded and the one after it can be packed
// now (Basic runs its steps in series; Oracle loads nothing).
bool can_pack_ahead(const prefill_state& st) {
  return st.cfg.mode != load_mode::basic && moves_bytes(st.cfg) && st.step
         && st.step->loaded && !st.next;
}

// Packs every GPU's batch; nothing when no GPU has a ready request. While a
// step runs (packing ahead), a request of it with tokens left counts as
// done with its chunk there: its next chunk may follow in this step.
std::optional<prefill_step> pack_step(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  std::unordered_map<uint64_t, uint32_t> running; // job: its chunk's end
  if (st.step)
    for (auto& c : st.step->chunks)
      running[c.job] = c.first + c.tokens;
  auto step = std::make_optional<prefill_step>();
  step->window = cfg.mode == load_mode::basic
                     ? std::max<uint32_t>(cfg.model.layers, 1)
                     : std::max<uint32_t>(cfg.layer_window, 1);
  step->window =
      std::min(step->window, std::max<uint32_t>(cfg.model.layers, 1));
  pack_limits lim;
  lim.policy = cfg.packing;
  lim.quota_s = cfg.quota_s;
  lim.batch_tokens = cfg.batch_tokens;
  lim.resident_layers = step->window;
  lim.bpt = bpt(cfg);
  lim.min_chunk = cfg.model.block_tokens;
  auto predict = [&cfg](uint64_t cached, uint64_t bsz) {
    return attention_seconds(cfg, gpu::sequence_shape{cached, bsz});
  };
  std::vector<std::vector<gpu::sequence_shape>> shapes(st.lanes.size());
  bool any = false;
  step->lanes.resize(st.lanes.size());
  for (uint32_t g = 0; g < st.lanes.size(); ++g) {
    auto& lane = st.lanes[g];
    // The GPU's HBM for KV (in real bytes, the size of its staging).
    lim.hbm_bytes = real_bytes(cfg.hbm_kv_bytes, cfg.byte_scale);
    std::vector<pack_candidate> ready;
    for (auto id : lane.fifo) {
      auto& j = st.jobs.at(id);
      if (j.phase == pe_phase::ready) {
        ready.push_back(pack_candidate{
            id, j.done_tokens, j.tokens - std::min(j.tokens, j.done_tokens)});
        continue;
      }
      auto r = running.find(id);
      if (j.phase == pe_phase::prefilling && !j.failed && r != running.end()
          && r->second < j.tokens)
        ready.push_back(pack_candidate{id, r->second, j.tokens - r->second});
    }
    if (ready.empty())
      continue;
    auto packed = pack_gpu_batch(ready, lim, predict);
    if (packed.unfit != 0) {
      fail_job(self, packed.unfit,
               caf::make_error(gpu::gpu_errc::budget_exceeded,
                               "the KV of request "
                                   + std::to_string(packed.unfit)
                                   + " does not fit a prefill GPU's HBM"));
      continue;
    }
    auto& sl = step->lanes[g];
    for (auto& ch : packed.chunks) {
      auto& j = st.jobs.at(ch.id);
      step_chunk c;
      c.request_id = ch.id;
      c.decode_actor = j.a.decode_actor;
      c.first = static_cast<uint32_t>(ch.cached);
      c.tokens = static_cast<uint32_t>(ch.bsz);
      c.pe_side_tokens = j.pe_side_tokens;
      // The hits go with the first chunk (a running one, if any).
      c.send_hits = !j.hits_sent && running.count(ch.id) == 0;
      c.offset = sl.layer_bytes;
      if (cfg.real_bytes) {
        c.hashes = j.hashes;
        c.pe_leases = j.pe_blocks;
        c.slot = j.slot;
      }
      sl.layer_bytes += (uint64_t{c.first} + c.tokens) * bpt(cfg);
      sl.chunks.push_back(c);
      shapes[g].push_back(gpu::sequence_shape{ch.cached, ch.bsz});
      j.phase = pe_phase::prefilling;
      any = true;
    }
  }
  if (!any)
    return std::nullopt;
  step->layer_s = prefill_step_layer(cfg, shapes).layer_s;
  if (auto& stats = cfg.stats) {
    ++stats->steps;
    for (auto& l : step->lanes) {
      stats->chunks += l.chunks.size();
      stats->batch(l.chunks.size());
    }
  }
  step->layers = cfg.model.layers;
  step->id = st.next_step++;
  return step;
}

// Packs the next step and hands it to the streamer (when some GPU has a
// ready request): the running one, or (packed ahead) the one after it.
void start_step(self_ptr self) {
  auto& st = self->state;
  auto plan = pack_step(self);
  if (!plan)
    return;
  auto run = std::make_unique<running_step>();
  run->id = plan->id;
  for (auto& lane : plan->lanes)
    for (auto& c : lane.chunks)
      run->chunks.push_back(running_chunk{c.request_id, c.first, c.tokens});
  (st.step ? st.next : st.step) = std::move(run);
  hand_off(self, st.streamer, run_step_atom_v, std::move(*plan));
}

group_report group_load(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  group_report g;
  g.group = cfg.group;
  g.role = engine_role::prefill;
  auto q = read_queue_of(cfg);
  for (uint32_t k = 0; k < st.lanes.size(); ++k) {
    auto x =
        lane_load(cfg, k, st.lanes[k].seq, st.lanes[k].tok, cfg.hbm_kv_bytes);
    x.read_q_tokens = q.tokens;
    x.read_q_bytes = q.bytes;
    g.engines.push_back(x);
  }
  return g;
}

void schedule_fetch(self_ptr self) {
  auto& cfg = self->state.cfg;
  auto d = cfg.time.to_actor(std::chrono::nanoseconds(cfg.fetch_period_ns));
  self->delayed_send(self, d, fetch_tick_atom_v);
}

// The group's fetch: its GPUs' loads and read queue to the scheduler, the
// reply's requests placed here.
void fetch(self_ptr self) {
  auto& cfg = self->state.cfg;
  auto sched = caf::actor_cast<scheduler_actor>(cfg.scheduler);
  auto sent = self->clock().now();
  self->request(sched, caf::infinite, fetch_atom_v, group_load(self))
      .then(
          [self, sent](work_batch& w) {
            // The control plane's latency as the engine sees it: scheduler
            // work plus, across processes, the CAF links both ways (what a
            // saturating KV stream must not delay).
            auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           self->clock().now() - sent)
                           .count();
            auto& cfg = self->state.cfg;
            if (cfg.hooks)
              cfg.hooks->observe(
                  "dualpath_control_rtt_seconds",
                  {{"node", cfg.node->name}, {"message", "fetch"}},
                  static_cast<double>(rtt) / 1e9);
            if (!w.items.empty())
              on_assigned(self, w, rtt);
            schedule_fetch(self);
          },
          [self](caf::error& err) {
            auto& cfg = self->state.cfg;
            if (cfg.hooks)
              cfg.hooks->count(
                  "dualpath_errors_total",
                  {{"source", "prefill_engine"}, {"kind", "fetch"}});
            if (cfg.observer) {
              event_record ev;
              ev.source = cfg.node->name + "/prefill";
              ev.kind = "fetch_failed";
              ev.at_ns = since_start(cfg.time, emulated_now(self, cfg.time));
              ev.detail = caf::to_string(err);
              self->send(cfg.observer, event_atom_v, std::move(ev));
            }
            schedule_fetch(self);
          });
}

impl_actor::behavior_type prefill_engine(self_ptr self, engine_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  if (st.cfg.devices.size() < st.cfg.gpus || !st.cfg.node) {
    self->quit(caf::make_error(caf::sec::invalid_argument,
                               "prefill engine needs its node and one device "
                               "per GPU"));
    return impl_actor::behavior_type::make_empty_behavior();
  }
  st.lanes.resize(st.cfg.gpus);
  // The layer streamer runs the steps; each of the two stops when the
  // other goes down.
  auto streamer =
      spawn_layer_streamer(self->home_system(), st.cfg,
                           caf::actor_cast<layer_streamer_reports>(self));
  if (!streamer) {
    self->quit(
        caf::make_error(caf::sec::runtime_error,
                        "prefill engine's layer streamer: "
                            + self->home_system().render(streamer.error())));
    return impl_actor::behavior_type::make_empty_behavior();
  }
  st.streamer = std::move(*streamer);
  self->monitor(st.streamer);
  // A decode node was lost (its node died; in a deployment the node agent
  // passes the notice on): its requests fail here too, so the engine goes
  // on and the scheduler re-queues them. The streamer lost: the engine
  // cannot step its GPUs any more; it gives its requests' buffer slots back
  // and stops with an error naming the streamer (the scheduler and the
  // decode nodes re-queue and drop its requests).
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.streamer.address()) {
      std::vector<uint64_t> ids;
      for (auto& [id, j] : st.jobs)
        ids.push_back(id);
      for (auto id : ids)
        remove_job(self, id);
      st.next.reset();
      st.step.reset();
      self->quit(caf::make_error(caf::sec::runtime_error,
                                 "prefill engine of " + st.cfg.node->name
                                     + ": its layer streamer went down: "
                                     + to_string(dm.reason)));
      return;
    }
    std::vector<uint64_t> lost;
    for (auto& [id, j] : self->state.jobs)
      if (!j.failed && j.a.decode_actor
          && j.a.decode_actor.address() == dm.source)
        lost.push_back(id);
    for (auto id : lost)
      fail_job(self, id,
               caf::make_error(caf::sec::request_receiver_down,
                               "decode engine lost"));
    if (st.step)
      hand_off(self, st.streamer, lost_atom_v, dm.source);
  });
  if (st.cfg.scheduler)
    schedule_fetch(self);
  return {
      [self](prefill_atom, work_batch& w) { on_assigned(self, w, -1); },
      [self](status_atom) { return group_load(self); },
      [self](fetch_tick_atom) { fetch(self); },
      [self](kick_atom) {
        auto& st = self->state;
        st.kicked = false;
        if (!st.step || can_pack_ahead(st))
          start_step(self);
      },
      [self](step_loaded_atom, uint64_t step) {
        auto& st = self->state;
        for (auto* s : {st.step.get(), st.next.get()})
          if (s != nullptr && s->id == step) {
            release_loaded(self, *s);
            s->loaded = true;
          }
        if (can_pack_ahead(st))
          pump(self);
      },
      [self](fail_atom, uint64_t, uint64_t id, const caf::error& err) {
        fail_job(self, id, err);
      },
      [self](done_atom, uint64_t step) {
        auto& st = self->state;
        if (!st.step || st.step->id != step)
          return;
        auto finished = std::move(st.step);
        st.step = std::move(st.next);
        step_finished(self, *finished);
      },
  };
}

} // namespace

void fail_job(self_ptr self, uint64_t id, const caf::error& err) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.jobs.find(id);
  if (i == st.jobs.end() || i->second.failed)
    return;
  auto& j = i->second;
  if (j.phase >= pe_phase::admitting && j.a.decode_actor)
    self->send(caf::actor_cast<decode_engine_actor>(j.a.decode_actor),
               release_atom_v, j.id);
  if (cfg.scheduler)
    self->send(caf::actor_cast<scheduler_actor>(cfg.scheduler), fail_atom_v,
               request_failure{j.id, j.a.prefill, err});
  if (cfg.hooks)
    cfg.hooks->count("dualpath_errors_total",
                     {{"source", "prefill_engine"}, {"kind", "request"}});
  if (j.phase == pe_phase::prefilling && st.step) {
    j.failed = true; // the step skips it from now on and removes it at its end
    return;
  }
  remove_job(self, id);
}

void pump(self_ptr self) {
  auto& st = self->state;
  for (auto& lane : st.lanes)
    admit_ahead(self, lane);
  if (st.kicked || (st.step && !can_pack_ahead(st)))
    return;
  st.kicked = true;
  self->send(self, kick_atom_v);
}

void release_loaded(self_ptr self, const running_step& step) {
  auto& st = self->state;
  for (auto& c : step.chunks) {
    auto i = st.jobs.find(c.job);
    if (i == st.jobs.end() || c.first + c.tokens < i->second.tokens)
      continue; // a later chunk reads the hits again
    auto& j = i->second;
    j.pe_blocks.clear();
    release_leases(self, std::move(j.leases));
    j.leases.clear();
  }
}

void step_finished(self_ptr self, const running_step& step) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto now = since_start(cfg.time, emulated_now(self, cfg.time));
  for (auto& c : step.chunks) {
    auto i = st.jobs.find(c.job);
    if (i == st.jobs.end())
      continue;
    auto& j = i->second;
    if (j.failed) {
      remove_job(self, c.job);
      continue;
    }
    if (!j.hits_sent && c.first + c.tokens < j.tokens && cfg.stats)
      ++cfg.stats->chunked; // its first chunk was not all of its prompt
    j.hits_sent = true;
    j.done_tokens = c.first + c.tokens;
    if (j.done_tokens >= j.tokens) {
      if (cfg.hooks && cfg.hooks->tracing())
        span(cfg, "gpu", j.lane, "prefill", j.id, -1,
             since_start(cfg.time, j.placed_at), now);
      remove_job(self, c.job);
    } else {
      // Its next chunk in a later step, unless the step packed ahead (now
      // running) holds it already.
      bool held = false;
      if (st.step)
        for (auto& x : st.step->chunks)
          held = held || x.job == c.job;
      if (!held)
        j.phase = pe_phase::ready;
    }
  }
  pump(self);
}

} // namespace dualpath::actors::prefill

namespace dualpath::actors {

prefill_engine_actor spawn_prefill_engine(caf::actor_system& sys,
                                          engine_config cfg) {
  return caf::actor_cast<prefill_engine_actor>(
      sys.spawn(prefill::prefill_engine, std::move(cfg)));
}

} // namespace dualpath::actors
