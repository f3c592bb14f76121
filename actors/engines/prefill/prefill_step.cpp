// One step of a prefill node's GPUs, layer by layer (see prefill_engine.hpp
// and prefill_step.hpp). Real bytes are copied at once (byte-scaled); the
// actor waits the emulated time of every step with delayed messages until
// the paced links and the compute model say the step is over.
#include "actors/engines/prefill/prefill_step.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/bulk/bulk_post.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/protocol/decode_engine_actor.hpp"

namespace dualpath::actors::prefill {

namespace {

namespace bulk = transport::bulk;

time_point reserve(const link_ptr& link, uint64_t nominal, time_point now) {
  return link && nominal > 0 ? link->reserve(nominal, now) : now;
}

const link_ptr& lane_link(const std::vector<link_ptr>& links, uint32_t rank) {
  static const link_ptr none;
  return rank < links.size() ? links[rank] : none;
}

bool current(self_ptr self, uint64_t step) {
  auto& s = self->state.step;
  return s && s->id == step;
}

pe_job* job_of(self_ptr self, uint64_t id) {
  auto i = self->state.jobs.find(id);
  return i == self->state.jobs.end() || i->second.failed ? nullptr : &i->second;
}

// Staging offset of token `t` of chunk `c` in layer `l`'s slot.
uint64_t staging_at(const prefill_step_run& s, const step_lane& lane,
                    const step_chunk& c, uint32_t l, uint64_t t, uint64_t bpt) {
  return uint64_t{l % s.window} * lane.layer_bytes + c.offset + t * bpt;
}

uint64_t nominal_tokens(const engine_config& cfg, uint64_t tokens) {
  return tokens * cfg.model.nominal_bytes_per_token_layer;
}

// Observation: a span of every chunk of a lane (tracing only).
void trace_lane(self_ptr self, uint32_t g, const char* track, const char* name,
                int32_t layer, time_point begin, time_point end,
                uint64_t nominal = 0, const char* suffix = "") {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (!cfg.hooks || !cfg.hooks->tracing() || !st.step)
    return;
  for (auto& c : st.step->lanes[g].chunks)
    span(cfg, track, g, name, c.job, layer, since_start(cfg.time, begin),
         since_start(cfg.time, end), nominal, suffix);
}

void try_compute(self_ptr self);
void start_load(self_ptr self, uint32_t l);

// Loads of the next layers while the window has room.
void advance_loads(self_ptr self) {
  auto& s = *self->state.step;
  auto layers = static_cast<uint32_t>(s.layers.size());
  while (s.next_load < layers && s.next_load < s.first_live + s.window) {
    start_load(self, s.next_load++);
    if (!self->state.step)
      return;
  }
}

void load_done(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  if (lay.pushes_pending > 0)
    return;
  lay.load_known = true;
  if (l + 1 == s.layers.size() && moves_bytes(st.cfg)) {
    // Every layer is in GPU memory at the last one's ready time: the
    // buffer slots of requests done with the hits go back then.
    send_at(self, st.cfg.time, lay.ready_at, loaded_atom_v, s.id);
  }
  try_compute(self);
}

// The PE-side hits of layer l of every chunk: from the node's buffer into
// the GPU (CNIC-centric H2D: node DRAM + the GPU's cnic_rx), and the pushes
// of decode-side tokens from each decode node.
void start_load(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  lay.loading = true;
  auto now = emulated_now(self, cfg.time);
  lay.ready_at = now;
  if (!moves_bytes(cfg)) {
    load_done(self, l);
    return;
  }
  const auto bt = cfg.model.block_tokens;
  const auto unit = bpt(cfg);
  const uint64_t layer_block = uint64_t{bt} * unit;
  std::map<caf::actor, layer_batch> pushes;
  bulk::batch loopback; // h2d_via_transport: the copies as bulk writes
  loopback.tclass = transport::traffic_class::kv;
  lay.gpu.resize(s.lanes.size());
  for (uint32_t g = 0; g < s.lanes.size(); ++g) {
    auto& lane = s.lanes[g];
    auto& staging = st.lanes[g].staging;
    if (cfg.real_bytes && lane.layer_bytes > 0 && cfg.devices[g]) {
      auto buf = cfg.devices[g]->allocate(lane.layer_bytes);
      if (buf)
        lay.gpu[g] = std::move(*buf);
    }
    uint64_t local = 0;
    for (auto& c : lane.chunks) {
      auto* j = job_of(self, c.job);
      if (j == nullptr)
        continue;
      // PE-side hits [0, pe_side_tokens), one Layer Block per block.
      for (uint32_t b = 0; uint64_t{b} * bt < j->pe_side_tokens; ++b) {
        auto dst = staging_at(s, lane, c, l, uint64_t{b} * bt, unit);
        if (cfg.real_bytes && b < j->pe_block.size() && j->pe_block[b]) {
          auto src = j->pe_block[b] + l * layer_block;
          if (cfg.h2d_via_transport && cfg.node->pool_registration) {
            auto pool_base = reinterpret_cast<const std::byte*>(
                cfg.node->pool_registration->data());
            auto to =
                staging.registration.describe().subrange(dst, layer_block);
            if (to)
              loopback.writes.push_back(bulk::write_request{
                  cfg.node->pool_registration,
                  static_cast<uint64_t>(src - pool_base), *to});
          } else {
            std::memcpy(staging.memory.get() + dst, src, layer_block);
          }
        }
        local += bt;
      }
      // Decode-side hits and earlier chunks' KV: pushed by the decode node.
      if (c.first > j->pe_side_tokens) {
        layer_chunk p;
        p.request_id = j->id;
        p.first_token = j->pe_side_tokens;
        p.tokens = c.first - j->pe_side_tokens;
        if (cfg.real_bytes) {
          auto to = staging.registration.describe().subrange(
              staging_at(s, lane, c, l, j->pe_side_tokens, unit),
              uint64_t{p.tokens} * unit);
          if (!to) {
            fail_job(self, j->id, to.error());
            continue;
          }
          p.destination = *to;
        }
        auto& batch = pushes[j->a.decode_actor];
        batch.layer = l;
        batch.chunks.push_back(std::move(p));
      }
    }
    if (local > 0) {
      auto nominal = nominal_tokens(cfg, local);
      auto rx = reserve(lane_link(cfg.node->cnic_rx, g), nominal, now);
      auto t = std::max({now, rx, reserve(cfg.node->dram, nominal, now)});
      lay.ready_at = std::max(lay.ready_at, t);
      trace_lane(self, g, "cnic", "h2d", static_cast<int32_t>(l), now, rx,
                 nominal, " rx");
    }
  }
  auto step = s.id;
  if (!loopback.writes.empty()) {
    ++lay.pushes_pending;
    auto hdl = caf::actor_cast<caf::actor>(self);
    auto early = post_or_complete(*cfg.node->bulk, std::move(loopback),
                                  [hdl, step, l](bulk::completion c) {
                                    caf::anon_send(hdl, posted_atom_v, step, l,
                                                   true, std::move(c.error));
                                  });
    if (early) {
      --lay.pushes_pending;
      if (early->error) {
        // Every request of the layer read through the failed copy.
        for (auto& lane : s.lanes)
          for (auto& c : lane.chunks)
            fail_job(self, c.job, early->error);
      }
    }
  }
  for (auto& [de, batch] : pushes) {
    ++lay.pushes_pending;
    lay.push_targets.push_back(de);
    auto ids = std::vector<uint64_t>{};
    for (auto& c : batch.chunks)
      ids.push_back(c.request_id);
    // Whether the push from `de` is still awaited (a lost engine's was
    // settled already); removes it.
    auto settle = [self, step, l, de] {
      if (!current(self, step))
        return false;
      auto& targets = self->state.step->layers[l].push_targets;
      auto i = std::find(targets.begin(), targets.end(), de);
      if (i == targets.end())
        return false;
      targets.erase(i);
      return true;
    };
    self->request(caf::actor_cast<decode_engine_actor>(de), caf::infinite,
                  push_atom_v, std::move(batch))
        .then(
            [self, step, l, settle](layer_batch& r) {
              if (!settle())
                return;
              auto& st = self->state;
              auto& cfg = st.cfg;
              auto& lay = st.step->layers[l];
              auto now = emulated_now(self, cfg.time);
              auto t = std::max(now, from_ns(cfg.time, r.done_ns));
              for (auto& c : r.chunks) {
                auto* j = job_of(self, c.request_id);
                if (j == nullptr)
                  continue;
                auto nominal = nominal_tokens(cfg, c.tokens);
                auto rx = reserve(lane_link(cfg.node->cnic_rx, j->lane),
                                  nominal, now);
                t = std::max(t, rx);
                if (cfg.hooks && cfg.hooks->tracing())
                  span(cfg, "cnic", j->lane, "transfer", j->id,
                       static_cast<int32_t>(l), since_start(cfg.time, now),
                       since_start(cfg.time, rx), nominal, " rx");
              }
              lay.ready_at = std::max(lay.ready_at, t);
              --lay.pushes_pending;
              load_done(self, l);
            },
            [self, step, l, ids, settle](caf::error& err) {
              if (!settle())
                return;
              for (auto id : ids)
                fail_job(self, id, err);
              if (!current(self, step))
                return;
              --self->state.step->layers[l].pushes_pending;
              load_done(self, l);
            });
  }
  load_done(self, l);
}

// Schedules the compute of every layer whose loads are in, in order: a
// layer starts once the previous one ends and its KV is in (Basic: once
// every layer's is), and lasts the step's layer time on every GPU.
void try_compute(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *st.step;
  auto layers = static_cast<uint32_t>(s.layers.size());
  const bool basic = cfg.mode == load_mode::basic;
  while (s.next_compute < layers) {
    auto l = s.next_compute;
    auto& lay = s.layers[l];
    if (!lay.load_known)
      return;
    auto start = lay.ready_at;
    if (basic) {
      // Every layer resident first: the H2D of all layers, then compute.
      for (auto& x : s.layers) {
        if (!x.load_known)
          return;
        start = std::max(start, x.ready_at);
      }
    }
    if (l > 0)
      start = std::max(start, s.layers[l - 1].compute_end);
    else
      start = std::max(start, s.began);
    lay.compute_end = start + gpu::to_duration(s.layer_s);
    lay.compute_scheduled = true;
    ++s.next_compute;
    auto now = emulated_now(self, cfg.time);
    self->delayed_send(self, cfg.time.to_actor(lay.compute_end - now),
                       computed_atom_v, s.id, l);
  }
}

void start_send(self_ptr self, uint32_t l);

void post_done(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  if (lay.posts_pending > 0)
    return;
  send_at(self, st.cfg.time, lay.send_done, sent_atom_v, s.id, l);
}

// Layer l's KV of every chunk to its decode node: the new tokens, and with a
// request's first chunk its PE-side hits (decode-side hits are there
// already). One bulk batch per decode node, class kv, the GPU's cnic_tx.
void start_send(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  auto now = emulated_now(self, cfg.time);
  lay.send_done = now;
  if (!moves_bytes(cfg)) {
    post_done(self, l);
    return;
  }
  const auto bt = cfg.model.block_tokens;
  const auto unit = bpt(cfg);
  std::map<std::string, bulk::batch> batches;
  std::map<std::string, std::vector<uint64_t>> batch_jobs;
  for (uint32_t g = 0; g < s.lanes.size(); ++g) {
    auto& lane = s.lanes[g];
    auto& staging = st.lanes[g].staging;
    uint64_t tokens = 0;
    for (auto& c : lane.chunks) {
      auto* j = job_of(self, c.job);
      if (j == nullptr)
        continue;
      std::pair<uint32_t, uint32_t> ranges[2] = {
          {0, c.send_hits ? j->pe_side_tokens : 0},
          {c.first, c.first + c.tokens}};
      for (auto [first, last] : ranges) {
        if (first >= last)
          continue;
        tokens += last - first;
        if (!cfg.real_bytes)
          continue;
        bool ok = true;
        for (auto& seg : block_segments(first, last - first, bt)) {
          if (seg.block >= j->slot.blocks.size()) {
            ok = false;
            break;
          }
          auto dst = j->slot.blocks[seg.block].subrange(
              block_offset(l, seg.token_in_block, bt, unit),
              uint64_t{seg.tokens} * unit);
          if (!dst) {
            ok = false;
            break;
          }
          auto& out = batches[dst->node];
          out.tclass = transport::traffic_class::kv;
          out.writes.push_back(bulk::write_request{
              &staging.registration,
              staging_at(s, lane, c, l, seg.first_token, unit), *dst});
        }
        if (!ok) {
          fail_job(self, j->id,
                   caf::make_error(caf::sec::invalid_argument,
                                   "decode slot of request "
                                       + std::to_string(j->id)
                                       + " lacks a block"));
          break;
        }
        batch_jobs[j->slot.blocks.front().node].push_back(j->id);
      }
    }
    if (tokens > 0) {
      auto nominal = nominal_tokens(cfg, tokens);
      auto tx = reserve(lane_link(cfg.node->cnic_tx, g), nominal, now);
      lay.send_done = std::max(lay.send_done, tx);
      trace_lane(self, g, "cnic", "send", static_cast<int32_t>(l), now, tx,
                 nominal, " tx");
    }
  }
  auto step = s.id;
  auto hdl = caf::actor_cast<caf::actor>(self);
  for (auto& [node, batch] : batches) {
    ++lay.posts_pending;
    batch.tag = (step << 16) | l;
    auto early = post_or_complete(*cfg.node->bulk, std::move(batch),
                                  [hdl, step, l](bulk::completion c) {
                                    caf::anon_send(hdl, posted_atom_v, step, l,
                                                   false, std::move(c.error));
                                  });
    if (early) {
      --lay.posts_pending;
      if (early->error)
        for (auto id : batch_jobs[node])
          fail_job(self, id, early->error);
      if (!current(self, step))
        return;
    }
  }
  post_done(self, l);
}

} // namespace

void run_step(self_ptr self, std::unique_ptr<prefill_step_run> step) {
  auto& st = self->state;
  st.step = std::move(step);
  st.step->began = emulated_now(self, st.cfg.time);
  advance_loads(self);
}

void on_posted(self_ptr self, uint64_t step, uint32_t l, bool load,
               caf::error err) {
  if (!current(self, step))
    return;
  auto& s = *self->state.step;
  if (l >= s.layers.size())
    return;
  if (err)
    for (auto& lane : s.lanes)
      for (auto& c : lane.chunks)
        fail_job(self, c.job, err);
  if (!current(self, step))
    return;
  auto& lay = self->state.step->layers[l];
  if (load) {
    --lay.pushes_pending;
    load_done(self, l);
  } else {
    --lay.posts_pending;
    post_done(self, l);
  }
}

void lost_decode_engine(self_ptr self, const caf::actor_addr& de) {
  auto& st = self->state;
  if (!st.step)
    return;
  auto step = st.step->id;
  for (uint32_t l = 0; l < st.step->layers.size(); ++l) {
    if (!current(self, step))
      return;
    auto& lay = st.step->layers[l];
    auto i =
        std::find_if(lay.push_targets.begin(), lay.push_targets.end(),
                     [&de](const caf::actor& x) { return x.address() == de; });
    if (i == lay.push_targets.end())
      continue;
    lay.push_targets.erase(i);
    --lay.pushes_pending;
    load_done(self, l);
  }
}

void on_loaded(self_ptr self, uint64_t step) {
  if (current(self, step))
    release_loaded(self, *self->state.step);
}

void on_computed(self_ptr self, uint64_t step, uint32_t l) {
  if (!current(self, step))
    return;
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  const auto unit = bpt(cfg);
  if (copies_bytes(cfg)) {
    // The new tokens' KV of layer l (the deterministic content), and the
    // layer's KV into GPU memory.
    for (uint32_t g = 0; g < s.lanes.size(); ++g) {
      auto& lane = s.lanes[g];
      auto& staging = st.lanes[g].staging;
      std::vector<gpu::copy_chunk> chunks;
      for (auto& c : lane.chunks) {
        auto* j = job_of(self, c.job);
        if (j == nullptr)
          continue;
        auto off = staging_at(s, lane, c, l, c.first, unit);
        fill_tokens(j->hashes, cfg.model.block_tokens, l, c.first,
                    c.first + c.tokens, unit, staging.memory.get() + off);
        chunks.push_back(gpu::copy_chunk{staging_at(s, lane, c, l, 0, unit),
                                         c.offset,
                                         uint64_t{c.first + c.tokens} * unit});
      }
      if (!chunks.empty() && g < lay.gpu.size() && lay.gpu[g].valid()) {
        auto& dev = *cfg.devices[g];
        auto err =
            dev.copy_h2d(staging.pinned, lay.gpu[g], chunks, staging.stream);
        if (!err)
          err = dev.synchronize(staging.stream);
        if (err)
          for (auto& c : lane.chunks)
            fail_job(self, c.job, err);
        if (!current(self, step))
          return;
      }
    }
  }
  if (cfg.hooks) {
    auto now = emulated_now(self, cfg.time);
    for (uint32_t g = 0; g < s.lanes.size(); ++g)
      trace_lane(self, g, "gpu", "compute", static_cast<int32_t>(l),
                 now - gpu::to_duration(s.layer_s), now);
    cfg.hooks->count("dualpath_prefill_layers_total",
                     {{"node", cfg.node->name}});
  }
  lay.computed = true;
  if (cfg.mode != load_mode::basic) {
    start_send(self, l);
  } else if (l + 1 == s.layers.size()) {
    // Basic: every layer's KV goes out once the whole prefill is done.
    for (uint32_t k = 0; k < s.layers.size() && current(self, step); ++k)
      start_send(self, k);
  }
}

void on_sent(self_ptr self, uint64_t step, uint32_t l) {
  if (!current(self, step))
    return;
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *st.step;
  auto& lay = s.layers[l];
  const auto bt = cfg.model.block_tokens;
  // Tell each decode node what of layer l is in its buffer now.
  std::map<caf::actor, layer_batch> notes;
  auto done_ns = since_start(cfg.time, lay.send_done);
  for (auto& lane : s.lanes)
    for (auto& c : lane.chunks) {
      auto* j = job_of(self, c.job);
      if (j == nullptr)
        continue;
      auto& note = notes[j->a.decode_actor];
      note.layer = l;
      note.done_ns = done_ns;
      auto add = [&](uint32_t first, uint32_t last) {
        if (first >= last)
          return;
        layer_chunk x;
        x.request_id = j->id;
        x.first_token = first;
        x.tokens = last - first;
        x.bytes = moves_bytes(cfg) ? uint64_t{x.tokens} * bpt(cfg) : 0;
        note.chunks.push_back(x);
      };
      if (c.send_hits)
        add(0, j->pe_side_tokens);
      add(c.first, c.first + c.tokens);
      (void)bt;
    }
  for (auto& [de, note] : notes)
    if (!moves_bytes(cfg) || !note.chunks.empty()) {
      if (!moves_bytes(cfg))
        note.done_ns = 0;
      self->send(caf::actor_cast<decode_engine_actor>(de), layer_atom_v,
                 std::move(note));
    }
  lay.gpu.clear();
  lay.sent = true;
  while (s.first_live < s.layers.size() && s.layers[s.first_live].sent)
    ++s.first_live;
  if (s.first_live == s.layers.size()) {
    auto finished = std::move(st.step);
    step_finished(self, *finished);
    return;
  }
  advance_loads(self);
}

} // namespace dualpath::actors::prefill
