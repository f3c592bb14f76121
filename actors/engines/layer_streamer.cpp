#include "actors/engines/layer_streamer.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/type_id.hpp>

#include "actors/bulk/bulk_post.hpp"
#include "actors/engines/engine_common.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "transport/storage/block_format.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, loaded_atom,
             "lsloaded")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, computed_atom,
             "lscomputed")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, sent_atom,
             "lssent")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, sent_done_atom,
             "lssentdone")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, copied_atom,
             "lscopied")

namespace dualpath::actors {

namespace {

using namespace dualpath::actors::streamer_atoms;

namespace bulk = transport::bulk;

using time_point = emulated_time::time_point;

/// The H2D copies of a layer: none in flight, or in flight (their event's
/// completion notice, a `copied` message, is on its way).
enum class copy_phase : uint8_t { idle, in_flight };

struct layer_state {
  gpu::device_buffer gpu;
  copy_phase copy = copy_phase::idle;
  // The layer was sent while its copies were in flight: it is freed when
  // they complete.
  bool release_waits = false;
  // Layer Blocks pushed by decode engines land in `gpu` directly (GPU
  // memory registered for RDMA), not in the staging.
  bool direct = false;
  uint32_t pending_pushes = 0;
  uint32_t pending_sends = 0;
  caf::error send_error; // the first failed send's, as the transport said
  time_point load_start{};
  time_point ready_at{};
  time_point send_done_at{};
  bool loading = false;
  bool loaded = false;
  // skips_load_timers(): ready_at is final (every push answered), and
  // whether a `loaded` timer was armed for it.
  bool load_known = false;
  bool load_timer = false;
  bool computed = false;
  bool sending = false;
  bool sent = false;
  layer_timing timing;
};

struct active_batch {
  stream_plan plan;
  caf::response_promise rp;
  std::vector<uint64_t> token_offset; // first token of each item in a layer
  uint64_t batch_tokens = 0;
  std::vector<layer_state> layers;
  uint32_t window = 1;
  uint32_t next_load = 0;
  uint32_t next_compute = 0;
  uint32_t first_live = 0; // oldest layer not yet sent and freed
  bool computing = false;
  double compute_s = 0;
  uint64_t bytes_moved = 0;
  bool failed = false;
  time_point began_at{}; // emulated, for the timeline
};

struct streamer_state {
  engine_config cfg;
  std::shared_ptr<pe_staging> staging;
  std::deque<std::pair<stream_plan, caf::response_promise>> queue;
  std::unique_ptr<active_batch> batch;
  static inline const char* name = "layer_streamer";

  // A batch's GPU buffers may still be the target of copies in flight: they
  // complete before the buffers return to the pool.
  ~streamer_state() {
    if (batch && staging && staging->stream.valid())
      static_cast<void>(cfg.device->synchronize(staging->stream));
  }
};

using self_ptr = caf::stateful_actor<streamer_state>*;

uint64_t layer_bytes(const active_batch& b, const engine_config& cfg) {
  return b.batch_tokens * bpt(cfg);
}

// Whether a layer's load completes without its own timer: on a modeled
// plane nothing happens at that moment (real bytes copy to the GPU then),
// so advance() starts the layer's compute once the GPU is free and the
// layer's ready time has passed, and arms a timer only when the GPU waits
// for it. Basic mode waits for all layers (keeps one timer per layer).
bool skips_load_timers(const engine_config& cfg) {
  return moves_bytes(cfg) && !copies_bytes(cfg) && cfg.mode != load_mode::basic;
}

// Staging offset of token `token` of item `i` in the window slot of layer l.
uint64_t staging_offset(const active_batch& b, const engine_config& cfg,
                        uint32_t l, size_t i, uint64_t token) {
  return (l % b.window) * layer_bytes(b, cfg)
         + (b.token_offset[i] + token) * bpt(cfg);
}

void advance(self_ptr self);
void on_pushed(self_ptr self, const layer_ready& r);
void on_sent(self_ptr self, uint32_t l, uint64_t bytes, caf::error error);

// Observation (null hooks: nothing): one span per request of the batch on
// this engine's track ("gpu<rank>") or a direction of its compute NIC
// ("cnic<rank> rx", "cnic<rank> tx").
void trace(self_ptr self, const char* track, const char* name, int32_t layer,
           time_point begin, time_point end, uint64_t nominal_bytes = 0,
           const char* direction = "") {
  auto& st = self->state;
  auto& h = st.cfg.hooks;
  if (!h || !h->tracing() || !st.batch)
    return;
  auto b = since_start(st.cfg.time, begin);
  auto e = since_start(st.cfg.time, end);
  for (auto& item : st.batch->plan.items)
    span(st.cfg, track, name, item.request_id, layer, b, e, nominal_bytes,
         direction);
}

// The window in which this engine's compute NIC (one direction) moved
// `nominal` bytes whose reservation ended at `end`: a paced link serves its
// reservations one after another, so the windows of one link never overlap
// (the duration is rounded down). Not before `floor`.
time_point link_window(const engine_config& cfg, bool tx, uint64_t nominal,
                       time_point end, time_point floor) {
  auto& links = tx ? cfg.node->cnic_tx : cfg.node->cnic_rx;
  if (cfg.id.rank >= links.size() || links[cfg.id.rank]->rate() == 0)
    return floor;
  auto rate = static_cast<double>(links[cfg.id.rank]->rate());
  auto d = std::chrono::nanoseconds(
      static_cast<int64_t>(static_cast<double>(nominal) * 1e9 / rate));
  return std::max(floor, end - d);
}

void fail(self_ptr self, caf::error err) {
  auto& st = self->state;
  if (!st.batch || st.batch->failed)
    return;
  st.batch->failed = true;
  // Copies in flight still read the staging and write the layers' GPU
  // memory: they finish before either is reused (a rare, failed path may
  // wait; their notices then find no batch and are dropped).
  if (st.staging->stream.valid())
    static_cast<void>(st.cfg.device->synchronize(st.staging->stream));
  if (auto& h = st.cfg.hooks)
    h->count("dualpath_errors_total",
             {{"source", "layer_streamer"}, {"kind", "stream"}});
  st.batch->rp.deliver(std::move(err));
  st.batch.reset();
  if (!st.queue.empty())
    advance(self);
}

// Submits layer l's copies staging -> GPU memory (one batched call where the
// device has it) and the layer's event; its completion notice is a `copied`
// message. False when no copy is in flight (nothing to copy, failed, or
// waited for in place under simulated time).
bool h2d(self_ptr self, uint32_t l, std::vector<gpu::copy_chunk> chunks) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& lay = b.layers[l];
  if (chunks.empty() || !lay.gpu.valid())
    return false;
  auto& dev = *st.cfg.device;
  auto& staging = *st.staging;
  auto slot = l % b.window;
  while (staging.events.size() <= slot) {
    auto ev = dev.make_event();
    if (!ev) {
      fail(self, std::move(ev.error()));
      return false;
    }
    staging.events.push_back(std::move(*ev));
  }
  auto& ev = staging.events[slot];
  auto err = dev.copy_h2d(staging.pinned, lay.gpu, chunks, staging.stream);
  if (!err)
    err = dev.record(ev, staging.stream);
  if (!err && waits_for_device_in_place(self->home_system())) {
    // Simulated time: complete now, as if the notice had arrived.
    err = dev.synchronize(ev);
    if (err)
      fail(self, std::move(err));
    return false;
  }
  if (!err) {
    auto hdl = caf::actor_cast<caf::actor>(self);
    err = dev.notify(ev, staging.stream, [hdl, batch_id = b.plan.batch_id, l] {
      caf::anon_send(hdl, copied_atom_v, batch_id, l);
    });
  }
  if (err) {
    fail(self, std::move(err));
    return false;
  }
  lay.copy = copy_phase::in_flight;
  return true;
}

void release_layer(self_ptr self, uint32_t l);

// Layer l's copies completed: a loading layer is loaded; a sent one is
// freed.
void on_copied(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& lay = st.batch->layers[l];
  if (lay.copy != copy_phase::in_flight)
    return;
  lay.copy = copy_phase::idle;
  if (!lay.loaded) {
    lay.loaded = true;
    advance(self);
  } else if (lay.release_waits) {
    release_layer(self, l);
  }
}

void start_load(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[l];
  lay.loading = true;
  auto now = emulated_now(self, cfg.time);
  lay.load_start = now;
  lay.ready_at = now;
  if (!moves_bytes(cfg)) {
    self->send(self, loaded_atom_v, b.plan.batch_id, l);
    return;
  }
  auto bytes = layer_bytes(b, cfg);
  // The layer's GPU buffer only receives copies, which a modeled data plane
  // skips (begin() already checked that the window fits the HBM budget).
  if (bytes > 0 && cfg.real_bytes) {
    auto buf = cfg.device->allocate(bytes);
    if (!buf) {
      fail(self, std::move(buf.error()));
      return;
    }
    lay.gpu = std::move(*buf);
  }
  const auto bt = cfg.model.block_tokens;
  const uint64_t block_layer_bytes = uint64_t{bt} * bpt(cfg);
  const uint64_t payload = block_layer_bytes * cfg.model.layers;
  uint64_t local_nominal = 0;
  for (size_t i = 0; i < b.plan.items.size(); ++i) {
    auto& item = b.plan.items[i];
    for (auto& lease : item.hits) {
      if (lease.block_index >= item.pe_side_blocks)
        continue;
      // A modeled run of blocks counts each of them (below pe_side_blocks).
      auto blocks = std::min<uint64_t>(lease.blocks,
                                       item.pe_side_blocks - lease.block_index);
      if (cfg.real_bytes) {
        auto src = lease_payload(lease, payload) + l * block_layer_bytes;
        std::memcpy(st.staging->memory.get()
                        + staging_offset(b, cfg, l, i,
                                         uint64_t{lease.block_index} * bt),
                    src, block_layer_bytes);
      }
      local_nominal += blocks * bt * cfg.model.nominal_bytes_per_token_layer;
    }
  }
  if (local_nominal > 0) {
    auto& node = *cfg.node;
    auto t = now;
    if (node.dram)
      t = std::max(t, node.dram->reserve(local_nominal, now));
    auto rx = now;
    if (cfg.id.rank < node.cnic_rx.size())
      rx = node.cnic_rx[cfg.id.rank]->reserve(local_nominal, now);
    t = std::max(t, rx);
    lay.ready_at = t;
    lay.timing.h2d_ns = to_ns(t - now);
    trace(self, "cnic", "h2d", static_cast<int32_t>(l),
          link_window(cfg, false, local_nominal, rx, now), rx, local_nominal,
          " rx");
  }
  // Where decode engines push: into the layer's GPU memory when it lies in
  // the slab registered for RDMA, else into the staging (copied in later).
  auto& staging = *st.staging;
  uint64_t gpu_base = 0;
  if (staging.direct && lay.gpu.valid()) {
    auto at = cfg.device->locate(lay.gpu);
    if (at && at->slab == staging.device_slab) {
      lay.direct = true;
      gpu_base = at->offset;
    }
  }
  for (size_t i = 0; i < b.plan.items.size(); ++i) {
    auto& item = b.plan.items[i];
    if (item.hit_blocks <= item.pe_side_blocks)
      continue;
    uint32_t first = item.pe_side_blocks * bt;
    uint32_t count = (item.hit_blocks - item.pe_side_blocks) * bt;
    auto dst = lay.direct ? staging.device_registration.describe().subrange(
                   gpu_base + (b.token_offset[i] + first) * bpt(cfg),
                   uint64_t{count} * bpt(cfg))
                          : staging.registration.describe().subrange(
                              staging_offset(b, cfg, l, i, first),
                              uint64_t{count} * bpt(cfg));
    if (!dst) {
      fail(self, std::move(dst.error()));
      return;
    }
    ++lay.pending_pushes;
    auto de = caf::actor_cast<decode_engine_actor>(item.decode_actor);
    auto batch_id = b.plan.batch_id;
    self->request(de, caf::infinite, push_atom_v,
                  layer_push{item.request_id, l, first, count, *dst})
        .then(
            [self, batch_id](layer_ready& r) {
              if (self->state.batch
                  && self->state.batch->plan.batch_id == batch_id)
                on_pushed(self, r);
            },
            [self](caf::error& err) { fail(self, std::move(err)); });
  }
  if (lay.pending_pushes == 0) {
    if (skips_load_timers(cfg))
      lay.load_known = true; // the caller, advance(), goes on from here
    else
      self->delayed_send(self, cfg.time.to_actor(lay.ready_at - now),
                         loaded_atom_v, b.plan.batch_id, l);
  }
}

void on_pushed(self_ptr self, const layer_ready& r) {
  auto& st = self->state;
  if (!st.batch || r.layer >= st.batch->layers.size())
    return;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[r.layer];
  if (lay.pending_pushes == 0)
    return;
  auto now = emulated_now(self, cfg.time);
  auto nominal = nominal_of_real(r.bytes, cfg.model);
  auto t = std::max(now, from_ns(cfg.time, r.done_ns));
  auto& node = *cfg.node;
  if (cfg.id.rank < node.cnic_rx.size()) {
    auto rx = node.cnic_rx[cfg.id.rank]->reserve(nominal, now);
    t = std::max(t, rx);
    trace(self, "cnic", "transfer", static_cast<int32_t>(r.layer),
          link_window(cfg, false, nominal, rx, now), rx, nominal, " rx");
  }
  lay.ready_at = std::max(lay.ready_at, t);
  lay.timing.transfer_ns =
      std::max(lay.timing.transfer_ns, to_ns(t - lay.load_start));
  b.bytes_moved += r.bytes;
  if (cfg.hooks && cfg.real_bytes && !lay.direct)
    cfg.hooks->count("dualpath_gpu_staged_bytes_total", {{"node", cfg.id.node}},
                     static_cast<double>(nominal));
  if (--lay.pending_pushes == 0) {
    if (skips_load_timers(cfg)) {
      lay.load_known = true;
      advance(self);
    } else {
      self->delayed_send(self, cfg.time.to_actor(lay.ready_at - now),
                         loaded_atom_v, b.plan.batch_id, r.layer);
    }
  }
}

void on_loaded(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[l];
  if (lay.direct) {
    // Every push of the layer completed: the RDMA writes into GPU memory
    // become visible to the device work that reads them (compute).
    if (auto err = cfg.device->order_remote_writes()) {
      fail(self, std::move(err));
      return;
    }
  }
  if (copies_bytes(cfg)) {
    // The hits from the staging: the PE side's, and the DE side's unless
    // they were pushed into GPU memory directly.
    std::vector<gpu::copy_chunk> chunks;
    for (size_t i = 0; i < b.plan.items.size(); ++i) {
      auto& item = b.plan.items[i];
      uint64_t blocks = lay.direct ? item.pe_side_blocks : item.hit_blocks;
      uint64_t hit_tokens =
          std::min<uint64_t>(blocks * cfg.model.block_tokens, item.tokens);
      if (hit_tokens == 0)
        continue;
      chunks.push_back(gpu::copy_chunk{staging_offset(b, cfg, l, i, 0),
                                       (b.token_offset[i]) * bpt(cfg),
                                       hit_tokens * bpt(cfg)});
    }
    if (h2d(self, l, std::move(chunks)))
      return; // loaded once the copies complete (on_copied)
    if (!st.batch)
      return;
  }
  lay.loaded = true;
  advance(self);
}

void start_send(self_ptr self, uint32_t l);

void on_computed(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[l];
  if (copies_bytes(cfg)) {
    std::vector<gpu::copy_chunk> chunks;
    for (size_t i = 0; i < b.plan.items.size(); ++i) {
      auto& item = b.plan.items[i];
      uint32_t first = item.hit_blocks * cfg.model.block_tokens;
      if (first >= item.tokens)
        continue;
      auto off = staging_offset(b, cfg, l, i, first);
      fill_tokens(item.hashes, cfg.model.block_tokens, l, first, item.tokens,
                  bpt(cfg), st.staging->memory.get() + off);
      chunks.push_back(
          gpu::copy_chunk{off, (b.token_offset[i] + first) * bpt(cfg),
                          uint64_t{item.tokens - first} * bpt(cfg)});
    }
    // The layer is freed only once these copies completed (on_copied).
    h2d(self, l, std::move(chunks));
    if (!st.batch)
      return;
  }
  if (auto& h = cfg.hooks) {
    auto now = emulated_now(self, cfg.time);
    trace(self, "gpu", "compute", static_cast<int32_t>(l),
          now - std::chrono::nanoseconds(lay.timing.compute_ns), now);
    h->count("dualpath_prefill_layers_total", {{"node", cfg.id.node}});
  }
  lay.computed = true;
  b.computing = false;
  ++b.next_compute;
  if (cfg.mode != load_mode::basic)
    start_send(self, l);
  else if (b.next_compute == b.layers.size())
    for (uint32_t k = 0; k < b.layers.size(); ++k)
      start_send(self, k);
  if (st.batch)
    advance(self);
}

void start_send(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[l];
  lay.sending = true;
  auto now = emulated_now(self, cfg.time);
  lay.timing.send_ns = 0;
  lay.send_done_at = now;
  if (!moves_bytes(cfg)) {
    self->send(self, sent_done_atom_v, b.plan.batch_id, l);
    return;
  }
  const auto bt = cfg.model.block_tokens;
  std::map<std::string, bulk::batch> batches;
  uint64_t nominal = 0;
  for (size_t i = 0; i < b.plan.items.size(); ++i) {
    auto& item = b.plan.items[i];
    // PE-side hits and misses travel; DE-side hits are already at the DE.
    std::pair<uint64_t, uint64_t> ranges[2] = {
        {0,
         std::min<uint64_t>(uint64_t{item.pe_side_blocks} * bt, item.tokens)},
        {std::min<uint64_t>(uint64_t{item.hit_blocks} * bt, item.tokens),
         item.tokens}};
    for (auto [first, last] : ranges) {
      if (first >= last)
        continue;
      auto dst = item.destination.subrange(
          slot_offset(l, item.tokens, first, bpt(cfg)),
          (last - first) * bpt(cfg));
      if (!dst) {
        fail(self, std::move(dst.error()));
        return;
      }
      auto& out = batches[dst->node];
      out.tclass = transport::traffic_class::kv;
      out.writes.push_back(
          bulk::write_request{&st.staging->registration,
                              staging_offset(b, cfg, l, i, first), *dst});
      nominal += (last - first) * cfg.model.nominal_bytes_per_token_layer;
    }
  }
  auto& node = *cfg.node;
  if (nominal > 0 && cfg.id.rank < node.cnic_tx.size()) {
    lay.send_done_at = node.cnic_tx[cfg.id.rank]->reserve(nominal, now);
    trace(self, "cnic", "send", static_cast<int32_t>(l),
          link_window(cfg, true, nominal, lay.send_done_at, now),
          lay.send_done_at, nominal, " tx");
  }
  lay.timing.send_ns = to_ns(lay.send_done_at - now);
  if (batches.empty()) {
    self->send(self, sent_done_atom_v, b.plan.batch_id, l);
    return;
  }
  lay.pending_sends = static_cast<uint32_t>(batches.size());
  auto hdl = caf::actor_cast<caf::actor>(self);
  auto batch_id = b.plan.batch_id;
  std::vector<bulk::completion> early; // completed inside post()
  for (auto& kv : batches) {
    kv.second.tag = (batch_id << 16) | l;
    auto c = post_or_complete(*node.bulk, std::move(kv.second),
                              [hdl, batch_id, l](bulk::completion c) {
                                caf::anon_send(hdl, sent_atom_v, batch_id, l,
                                               c.bytes, std::move(c.error));
                              });
    if (c)
      early.push_back(std::move(*c));
  }
  for (auto& c : early) {
    if (!st.batch || st.batch->plan.batch_id != batch_id)
      return; // the batch failed meanwhile
    on_sent(self, l, c.bytes, std::move(c.error));
  }
}

void on_sent(self_ptr self, uint32_t l, uint64_t bytes, caf::error error) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& lay = b.layers[l];
  if (lay.pending_sends == 0)
    return;
  if (error && !lay.send_error)
    lay.send_error = std::move(error);
  b.bytes_moved += bytes;
  if (--lay.pending_sends > 0)
    return;
  if (lay.send_error) {
    fail(self, std::move(lay.send_error));
    return;
  }
  auto now = emulated_now(self, st.cfg.time);
  self->delayed_send(self, st.cfg.time.to_actor(lay.send_done_at - now),
                     sent_done_atom_v, b.plan.batch_id, l);
}

void on_sent_done(self_ptr self, uint32_t l) {
  auto& st = self->state;
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  auto& lay = b.layers[l];
  const auto bt = cfg.model.block_tokens;
  auto done_ns = to_ns(lay.send_done_at - cfg.time.start());
  for (auto& item : b.plan.items) {
    uint64_t sent_tokens =
        std::min<uint64_t>(uint64_t{item.pe_side_blocks} * bt, item.tokens)
        + (item.tokens
           - std::min<uint64_t>(uint64_t{item.hit_blocks} * bt, item.tokens));
    uint64_t bytes = moves_bytes(cfg) ? sent_tokens * bpt(cfg) : 0;
    self->send(caf::actor_cast<decode_engine_actor>(item.decode_actor),
               layer_atom_v,
               layer_ready{item.request_id, l, bytes, bytes ? done_ns : 0});
  }
  if (lay.copy == copy_phase::in_flight) {
    lay.release_waits = true; // on_copied frees it
    return;
  }
  release_layer(self, l);
}

// Frees layer l's GPU memory and its staging slot, admitting layer l +
// window.
void release_layer(self_ptr self, uint32_t l) {
  auto& b = *self->state.batch;
  auto& lay = b.layers[l];
  lay.gpu = gpu::device_buffer{};
  lay.sent = true;
  while (b.first_live < b.layers.size() && b.layers[b.first_live].sent)
    ++b.first_live;
  advance(self);
}

void finish(self_ptr self) {
  auto& st = self->state;
  auto& b = *st.batch;
  stream_report rep;
  rep.batch_id = b.plan.batch_id;
  rep.bytes_moved = b.bytes_moved;
  for (auto& lay : b.layers)
    rep.layers.push_back(lay.timing);
  trace(self, "gpu", "prefill", -1, b.began_at,
        emulated_now(self, st.cfg.time));
  b.rp.deliver(std::move(rep));
  st.batch.reset();
}

void begin(self_ptr self, stream_plan plan, caf::response_promise rp) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto b = std::make_unique<active_batch>();
  b->plan = std::move(plan);
  b->rp = std::move(rp);
  b->began_at = emulated_now(self, cfg.time);
  for (auto& item : b->plan.items) {
    b->token_offset.push_back(b->batch_tokens);
    b->batch_tokens += item.tokens;
  }
  uint32_t layers = b->plan.layers;
  b->window = cfg.mode == load_mode::basic
                  ? std::max<uint32_t>(layers, 1)
                  : std::max<uint32_t>(b->plan.window, 1);
  b->layers.resize(layers);
  std::vector<gpu::sequence_shape> shapes;
  for (auto& item : b->plan.items) {
    uint64_t cached = std::min<uint64_t>(
        uint64_t{item.hit_blocks} * cfg.model.block_tokens, item.tokens);
    shapes.push_back(gpu::sequence_shape{cached, item.tokens - cached});
  }
  b->compute_s = prefill_layer_seconds(cfg, shapes);
  if (moves_bytes(cfg)
      && uint64_t{std::min(b->window, layers)} * layer_bytes(*b, cfg)
             > st.staging->size) {
    b->rp.deliver(caf::make_error(
        gpu::gpu_errc::budget_exceeded,
        "batch window does not fit the prefill engine's HBM: "
            + std::to_string(std::min(b->window, layers) * layer_bytes(*b, cfg))
            + " > " + std::to_string(st.staging->size) + " bytes"));
    return;
  }
  st.batch = std::move(b);
  advance(self);
}

void advance(self_ptr self) {
  auto& st = self->state;
  if (!st.batch) {
    if (st.queue.empty())
      return;
    auto [plan, rp] = std::move(st.queue.front());
    st.queue.pop_front();
    begin(self, std::move(plan), std::move(rp));
    return;
  }
  auto& b = *st.batch;
  auto& cfg = st.cfg;
  const uint32_t layers = static_cast<uint32_t>(b.layers.size());
  if (b.first_live == layers) {
    finish(self);
    advance(self);
    return;
  }
  while (b.next_load < layers && b.next_load < b.first_live + b.window) {
    start_load(self, b.next_load++);
    if (!st.batch)
      return;
  }
  if (!b.computing && b.next_compute < layers) {
    auto& lay = b.layers[b.next_compute];
    if (!lay.loaded && lay.load_known) {
      auto now = emulated_now(self, cfg.time);
      if (lay.ready_at <= now) {
        lay.loaded = true;
      } else if (!lay.load_timer) {
        lay.load_timer = true; // the GPU waits for this layer
        self->delayed_send(self, cfg.time.to_actor(lay.ready_at - now),
                           loaded_atom_v, b.plan.batch_id, b.next_compute);
      }
    }
  }
  if (!b.computing && b.next_compute < layers
      && b.layers[b.next_compute].loaded) {
    bool all_loaded = std::all_of(b.layers.begin(), b.layers.end(),
                                  [](auto& x) { return x.loaded; });
    if (cfg.mode != load_mode::basic || all_loaded) {
      b.computing = true;
      auto l = b.next_compute;
      auto d = gpu::to_duration(b.compute_s);
      b.layers[l].timing.layer = l;
      b.layers[l].timing.compute_ns = d.count();
      self->delayed_send(self, cfg.time.to_actor(d), computed_atom_v,
                         b.plan.batch_id, l);
    }
  }
}

caf::behavior streamer(self_ptr self, engine_config cfg,
                       std::shared_ptr<pe_staging> staging) {
  self->state.cfg = std::move(cfg);
  self->state.staging = std::move(staging);
  auto current = [self](uint64_t batch_id, uint32_t l) {
    auto& b = self->state.batch;
    return b && b->plan.batch_id == batch_id && l < b->layers.size();
  };
  // A decode engine of a queued or streaming batch was lost (its node died;
  // the prefill engine passes the notice on): nobody answers its pushes, so
  // those batches fail now and the scheduler re-queues their requests.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto involves = [&dm](const stream_plan& p) {
      return std::any_of(p.items.begin(), p.items.end(), [&dm](auto& it) {
        return it.decode_actor && it.decode_actor.address() == dm.source;
      });
    };
    auto lost = [] {
      return caf::make_error(caf::sec::request_receiver_down,
                             "decode engine lost");
    };
    auto& st = self->state;
    for (auto i = st.queue.begin(); i != st.queue.end();) {
      if (involves(i->first)) {
        i->second.deliver(lost());
        i = st.queue.erase(i);
      } else {
        ++i;
      }
    }
    if (st.batch && involves(st.batch->plan))
      fail(self, lost());
  });
  return {
      [self](stream_atom, stream_plan& plan) -> caf::result<stream_report> {
        auto rp = self->make_response_promise<stream_report>();
        self->state.queue.emplace_back(std::move(plan), rp);
        if (!self->state.batch)
          advance(self);
        return rp;
      },
      [self](layer_atom, const layer_ready& r) { on_pushed(self, r); },
      [self, current](loaded_atom, uint64_t batch_id, uint32_t l) {
        if (current(batch_id, l))
          on_loaded(self, l);
      },
      [self, current](computed_atom, uint64_t batch_id, uint32_t l) {
        if (current(batch_id, l))
          on_computed(self, l);
      },
      [self, current](sent_atom, uint64_t batch_id, uint32_t l, uint64_t bytes,
                      caf::error& error) {
        if (current(batch_id, l))
          on_sent(self, l, bytes, std::move(error));
      },
      [self, current](sent_done_atom, uint64_t batch_id, uint32_t l) {
        if (current(batch_id, l))
          on_sent_done(self, l);
      },
      [self, current](copied_atom, uint64_t batch_id, uint32_t l) {
        if (current(batch_id, l))
          on_copied(self, l);
      },
  };
}

} // namespace

namespace {

// Registers the engine's GPU memory (its device's first pool slab, the whole
// HBM budget) with the node's bulk transport for RDMA writes: as dma-buf
// device memory where the device exports it and the transport takes it, as
// host memory where the device's memory is host memory (the host backend).
// Otherwise the staging stays the landing zone, said once (notice) and
// counted per byte (dualpath_gpu_staged_bytes_total).
void register_gpu_memory(const engine_config& cfg, pe_staging& staging) {
  auto& dev = *cfg.device;
  auto& bulk = *cfg.node->bulk;
  const auto& caps = dev.capabilities();
  auto slabs = dev.slabs();
  caf::error err;
  if (slabs.empty()) {
    err = caf::make_error(gpu::gpu_errc::unsupported,
                          "the device has no memory pool slab");
  } else if (caps.host_addressable) {
    auto reg = bulk.register_region(slabs[0].base, slabs[0].size);
    if (reg)
      staging.device_registration = std::move(*reg);
    else
      err = std::move(reg.error());
  } else if (!caps.dmabuf_export) {
    err = caf::make_error(gpu::gpu_errc::unsupported,
                          caps.name + " cannot export dma-buf: " + caps.notes);
  } else if (!bulk.caps().device_memory) {
    err = caf::make_error(transport::transport_errc::unsupported,
                          "the " + bulk.caps().name
                              + " bulk transport registers host memory only");
  } else {
    auto fd = dev.export_dmabuf(0);
    if (!fd) {
      err = std::move(fd.error());
    } else {
      // The registration keeps its own reference to the dma-buf; the fd
      // closes when `fd` goes.
      auto reg =
          bulk.register_region(slabs[0].base, slabs[0].size,
                               transport::bulk::memory_kind::device, fd->fd());
      if (reg)
        staging.device_registration = std::move(*reg);
      else
        err = std::move(reg.error());
    }
  }
  if (!err) {
    staging.direct = true;
    staging.device_slab = 0;
    return;
  }
  staging.staged_why = gpu::describe(err);
  if (cfg.notice)
    cfg.notice("GPU memory of " + caps.name + " is not registered for RDMA ("
               + staging.staged_why
               + "): Layer Blocks pushed by decode engines are staged "
                 "through host memory and copied in (counted in "
                 "dualpath_gpu_staged_bytes_total)");
}

} // namespace

caf::expected<std::shared_ptr<pe_staging>>
pe_staging::make(const engine_config& cfg) {
  auto result = std::make_shared<pe_staging>();
  result->size = real_bytes(cfg.hbm_bytes, cfg.byte_scale);
  if (result->size == 0 || cfg.mode == load_mode::oracle)
    return result;
  // Not value-initialised: pages are touched only when KV lands there.
  result->memory = gpu::allocate_host_memory(result->size);
  if (!result->memory)
    return caf::make_error(gpu::gpu_errc::out_of_memory,
                           "prefill staging of " + std::to_string(result->size)
                               + " B: no host memory");
  if (cfg.device) {
    result->device = cfg.device;
    auto pinned = cfg.device->pin(result->memory.get(), result->size);
    if (!pinned)
      return std::move(pinned.error());
    result->pinned = std::move(*pinned);
    auto s = cfg.device->make_stream();
    if (!s)
      return std::move(s.error());
    result->stream = std::move(*s);
  }
  if (cfg.node && cfg.node->bulk) {
    auto reg =
        cfg.node->bulk->register_region(result->memory.get(), result->size);
    if (!reg)
      return std::move(reg.error());
    result->registration = std::move(*reg);
    if (cfg.device && cfg.real_bytes)
      register_gpu_memory(cfg, *result);
  }
  return result;
}

pe_staging::~pe_staging() {
  // Copies in flight read `memory` and write GPU memory: done first.
  if (device && stream.valid())
    static_cast<void>(device->synchronize(stream));
}

layer_streamer_actor spawn_layer_streamer(caf::actor_system& sys,
                                          engine_config cfg,
                                          std::shared_ptr<pe_staging> staging) {
  auto hdl = sys.spawn(streamer, std::move(cfg), std::move(staging));
  return caf::actor_cast<layer_streamer_actor>(hdl);
}

} // namespace dualpath::actors
