// The layer streamer (see layer_streamer.hpp): one step of a prefill node's
// GPUs, layer by layer. Real bytes are copied at once (byte-scaled); the
// actor waits the emulated time of every step with delayed messages until
// the paced links and the compute model say the step is over.
#include "actors/engines/streamer/layer_streamer.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/bulk/bulk_post.hpp"
#include "actors/engines/engine_common.hpp"
#include "actors/engines/engine_timing.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"
#include "transport/bulk/backend.hpp"

// Private atoms: messages the streamer sends itself (timers, completions
// from backend threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, computed_atom,
             "lscomputed")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, sent_atom,
             "lssent")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::streamer_atoms, posted_atom,
             "lsposted")

namespace dualpath::actors::streamer {

namespace {

using namespace dualpath::actors::streamer_atoms;
namespace bulk = transport::bulk;

using time_point = emulated_time::time_point;

// The streamer's whole interface: the public one plus its private messages:
// a layer computed, a layer's sends done (both in emulated time), and a
// bulk batch's completion from a backend thread (step, layer, the send's
// serial or `loopback_post` for a load's loopback copy, error).
using impl_actor = layer_streamer_actor::extend<
    caf::reacts_to<computed_atom, uint64_t, uint32_t>,
    caf::reacts_to<sent_atom, uint64_t, uint32_t>,
    caf::reacts_to<posted_atom, uint64_t, uint32_t, uint64_t, caf::error>>;

// The serial a load's loopback copy completes with (sends count from 1).
constexpr uint64_t loopback_post = 0;

// One GPU's staging: host memory mirroring its HBM for KV (real bytes),
// pinned with its device and registered with the node's bulk transport once.
struct staging {
  gpu::host_memory memory;
  uint64_t size = 0;
  gpu::pinned_host pinned;
  gpu::stream stream;
  transport::bulk::local_registration registration;
};

// One request's chunk in the running step.
struct chunk_run {
  step_chunk plan;
  uint32_t lane = 0;
  bool failed = false; // failed inside the step: skipped from then on
  // Real plane: the payload of every PE-side block (index < pe_side).
  std::vector<const std::byte*> pe_block;
};

// The token ranges [first, last) of a chunk's layer that go to its decode
// node, in order: the PE-side hits with the request's first chunk (empty
// otherwise), then the new tokens.
std::array<std::pair<uint32_t, uint32_t>, 2> sent_ranges(const step_chunk& p) {
  return {
      {{0, p.send_hits ? p.pe_side_tokens : 0}, {p.first, p.first + p.tokens}}};
}

struct lane_run {
  std::vector<chunk_run> chunks;
  uint64_t layer_bytes = 0; // real bytes of one layer slot
  // Where the layers loaded ahead (a step's layers [0, ahead), loaded while
  // the step before it still runs) lie: the top of the GPU's staging, clear
  // of both steps' window slots (layer_ahead_fits).
  uint64_t ahead_base = 0;
};

struct step_layer {
  uint32_t pushes_pending = 0; // push replies (and loopback H2D) awaited
  // The decode engines whose push reply is awaited: one lost meanwhile
  // never answers (a node lost behind the scheduler node), so its loss
  // settles the push (on_lost).
  std::vector<caf::actor> push_targets;
  bool loading = false;
  bool load_known = false; // every load answered: ready_at is final
  time_point ready_at{};
  bool compute_scheduled = false;
  time_point compute_end{};
  bool computed = false;
  uint32_t posts_pending = 0; // bulk sends awaited
  time_point send_done{};
  bool sent = false;
  std::vector<gpu::device_buffer> gpu; // per lane (real plane)
};

struct step_run {
  uint64_t id = 0;
  std::vector<lane_run> lanes;
  std::unordered_map<uint64_t, chunk_run*> by_request; // into lanes
  std::vector<step_layer> layers;
  uint32_t window = 1;
  double layer_s = 0;
  uint32_t next_load = 0;
  uint32_t next_compute = 0;
  uint32_t first_live = 0; // oldest layer not yet sent
  time_point began{};
  // Layers [0, ahead) have their own staging slots at each lane's
  // ahead_base: the step arrived while the one before it ran, and they load
  // once that step's loads are all issued (0: the step loads as a step
  // alone does, from slot 0, once it runs alone).
  uint32_t ahead = 0;
};

// How many of a step's first layers load ahead, across the boundary with
// the step before it (docs/tuning.md, "Where the last 12% goes").
constexpr uint32_t layers_ahead = 1;

struct streamer_state {
  // First member: the node's resources (bulk transport, devices) outlive
  // the staging registered with them.
  engine_config cfg;
  layer_streamer_reports engine;
  std::vector<staging> lanes; // per GPU
  // The running step, and the step after it (packed while `step`'s last
  // layers compute and send): it takes `step`'s place once `step` is sent.
  std::unique_ptr<step_run> step;
  std::unique_ptr<step_run> next;
  // Send batches in flight, by serial: the requests whose KV each carries
  // into their decode nodes' buffers. A request's failure reaches its
  // decode node (which then gives the request's buffer slots to others)
  // only once none of its sends is in flight: a later one would write into
  // another request's KV there.
  uint64_t next_send = 1;
  std::unordered_map<uint64_t, std::vector<uint64_t>> sends;
  std::unordered_map<uint64_t, uint32_t> sends_of; // per request
  struct held_failure {
    uint64_t step = 0;
    caf::error error;
  };
  std::unordered_map<uint64_t, held_failure> held; // per request
  static inline const char* name = "layer_streamer";
};

using self_ptr = impl_actor::stateful_pointer<streamer_state>;

time_point reserve(const link_ptr& link, uint64_t nominal, time_point now) {
  return link && nominal > 0 ? link->reserve(nominal, now) : now;
}

const link_ptr& lane_link(const std::vector<link_ptr>& links, uint32_t rank) {
  static const link_ptr none;
  return rank < links.size() ? links[rank] : none;
}

// The running step or the next one with id `step` (nullptr: neither).
step_run* find_step(self_ptr self, uint64_t step) {
  auto& st = self->state;
  for (auto* s : {st.step.get(), st.next.get()})
    if (s != nullptr && s->id == step)
      return s;
  return nullptr;
}

bool current(self_ptr self, uint64_t step) {
  return find_step(self, step) != nullptr;
}

bool is_next(self_ptr self, const step_run& s) {
  return self->state.next.get() == &s;
}

// Step `s`'s chunk of request `id`, unless it failed.
chunk_run* live_chunk(step_run& s, uint64_t id) {
  auto i = s.by_request.find(id);
  return i == s.by_request.end() || i->second->failed ? nullptr : i->second;
}

// A request failed inside a step: skipped from now on in both steps, its
// engine told once (which tells its decode node and the scheduler), once
// none of its sends is in flight (streamer_state::sends).
void fail_request(self_ptr self, uint64_t id, const caf::error& err) {
  auto& st = self->state;
  uint64_t step = 0;
  for (auto* s : {st.step.get(), st.next.get()}) {
    auto* c = s != nullptr ? live_chunk(*s, id) : nullptr;
    if (c == nullptr)
      continue;
    c->failed = true;
    if (step == 0)
      step = s->id;
  }
  if (step == 0)
    return;
  if (st.sends_of.count(id) != 0) {
    st.held.emplace(id, streamer_state::held_failure{step, err});
    return;
  }
  // The engine tells the decode node and the scheduler now, as it did
  // when the step ran inside it.
  hand_off(self, st.engine, fail_atom_v, step, id, err);
}

// Send `serial` ended: its requests' held failures go to the engine once
// their last send ended. Returns the requests it carried.
std::vector<uint64_t> send_ended(self_ptr self, uint64_t serial) {
  auto& st = self->state;
  auto i = st.sends.find(serial);
  if (i == st.sends.end())
    return {};
  auto ids = std::move(i->second);
  st.sends.erase(i);
  for (auto id : ids) {
    auto n = st.sends_of.find(id);
    if (n == st.sends_of.end() || --n->second > 0)
      continue;
    st.sends_of.erase(n);
    auto h = st.held.find(id);
    if (h == st.held.end())
      continue;
    auto held = std::move(h->second);
    st.held.erase(h);
    hand_off(self, st.engine, fail_atom_v, held.step, id, held.error);
  }
  return ids;
}

// Staging offset of layer `l`'s slot: a layer loaded ahead has its own at
// the top of the staging, the others take turns in the window's slots.
uint64_t slot_base(const step_run& s, const lane_run& lane, uint32_t l) {
  if (l < s.ahead)
    return lane.ahead_base + uint64_t{l} * lane.layer_bytes;
  return uint64_t{l % s.window} * lane.layer_bytes;
}

// Staging offset of token `t` of chunk `c` in layer `l`'s slot.
uint64_t staging_at(const step_run& s, const lane_run& lane, const chunk_run& c,
                    uint32_t l, uint64_t t, uint64_t bpt) {
  return slot_base(s, lane, l) + c.plan.offset + t * bpt;
}

uint64_t nominal_tokens(const engine_config& cfg, uint64_t tokens) {
  return tokens * cfg.model.nominal_bytes_per_token_layer;
}

// Observation: a span of every chunk of a lane (tracing only).
void trace_lane(self_ptr self, const step_run& s, uint32_t g, const char* track,
                const char* name, int32_t layer, time_point begin,
                time_point end, uint64_t nominal = 0, const char* suffix = "") {
  auto& cfg = self->state.cfg;
  if (!cfg.hooks || !cfg.hooks->tracing())
    return;
  for (auto& c : s.lanes[g].chunks)
    span(cfg, track, g, name, c.plan.request_id, layer,
         since_start(cfg.time, begin), since_start(cfg.time, end), nominal,
         suffix);
}

void try_compute(self_ptr self, step_run& s);
void start_load(self_ptr self, step_run& s, uint32_t l);

// Loads of the next layers while the window has room. The next step loads
// its layers ahead only, and only once the running step's loads are all
// issued; the rest once it runs alone.
void advance_loads(self_ptr self, step_run& s) {
  auto& st = self->state;
  auto id = s.id;
  auto layers = static_cast<uint32_t>(s.layers.size());
  auto limit = s.first_live + s.window;
  if (is_next(self, s)) {
    // The slots ahead are free once the running step's own layers ahead
    // are sent (a step of fewer layers than its window plus one).
    auto& run = *st.step;
    bool issued = run.next_load == run.layers.size();
    limit = issued && run.first_live >= run.ahead ? s.ahead : 0;
  }
  while (s.next_load < layers && s.next_load < limit) {
    start_load(self, s, s.next_load++);
    if (!current(self, id))
      return;
  }
  // The running step's last load is issued: the next step's layers ahead
  // may load now.
  if (!is_next(self, s) && s.next_load == layers && st.next)
    advance_loads(self, *st.next);
}

void load_done(self_ptr self, step_run& s, uint32_t l) {
  auto& st = self->state;
  auto& lay = s.layers[l];
  if (lay.pushes_pending > 0)
    return;
  lay.load_known = true;
  if (l + 1 == s.layers.size() && moves_bytes(st.cfg)) {
    // Every layer is in GPU memory at the last one's ready time: the
    // engine gives the buffer slots of requests done with the hits back
    // then.
    auto now = emulated_now(self, st.cfg.time);
    if (lay.ready_at <= now)
      self->send(st.engine, step_loaded_atom_v, s.id);
    else
      self->delayed_send(st.engine, st.cfg.time.to_actor(lay.ready_at - now),
                         step_loaded_atom_v, s.id);
  }
  try_compute(self, s);
}

// The PE-side hits of layer l of every chunk: from the node's buffer into
// the GPU (CNIC-centric H2D: node DRAM + the GPU's cnic_rx), and the pushes
// of decode-side tokens from each decode node.
void start_load(self_ptr self, step_run& s, uint32_t l) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& lay = s.layers[l];
  lay.loading = true;
  auto now = emulated_now(self, cfg.time);
  lay.ready_at = now;
  if (!moves_bytes(cfg)) {
    load_done(self, s, l);
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
    auto& staging = st.lanes[g];
    if (cfg.real_bytes && lane.layer_bytes > 0 && cfg.devices[g]) {
      auto buf = cfg.devices[g]->allocate(lane.layer_bytes);
      if (!buf) {
        // No room for the layer in this GPU's memory: its requests fail
        // (and are recomputed elsewhere), never computed on KV that is not
        // there.
        auto err =
            caf::make_error(caf::sec::runtime_error,
                            "layer " + std::to_string(l) + "'s KV on GPU "
                                + std::to_string(g) + " of " + cfg.node->name
                                + " (" + std::to_string(lane.layer_bytes)
                                + " B): " + gpu::describe(buf.error()));
        for (auto& c : lane.chunks)
          if (!c.failed)
            fail_request(self, c.plan.request_id, err);
        continue;
      }
      lay.gpu[g] = std::move(*buf);
    }
    uint64_t local = 0;
    for (auto& c : lane.chunks) {
      if (c.failed)
        continue;
      auto& p = c.plan;
      // PE-side hits [0, pe_side_tokens), one Layer Block per block.
      for (uint32_t b = 0; uint64_t{b} * bt < p.pe_side_tokens; ++b) {
        auto dst = staging_at(s, lane, c, l, uint64_t{b} * bt, unit);
        if (cfg.real_bytes && b < c.pe_block.size() && c.pe_block[b]) {
          auto src = c.pe_block[b] + l * layer_block;
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
      if (p.first > p.pe_side_tokens) {
        layer_chunk x;
        x.request_id = p.request_id;
        x.first_token = p.pe_side_tokens;
        x.tokens = p.first - p.pe_side_tokens;
        if (cfg.real_bytes) {
          auto to = staging.registration.describe().subrange(
              staging_at(s, lane, c, l, p.pe_side_tokens, unit),
              uint64_t{x.tokens} * unit);
          if (!to) {
            fail_request(self, p.request_id, to.error());
            continue;
          }
          x.destination = *to;
        }
        auto& batch = pushes[p.decode_actor];
        batch.layer = l;
        batch.chunks.push_back(std::move(x));
      }
    }
    if (local > 0) {
      auto nominal = nominal_tokens(cfg, local);
      auto rx = reserve(lane_link(cfg.node->cnic_rx, g), nominal, now);
      auto t = std::max({now, rx, reserve(cfg.node->dram, nominal, now)});
      lay.ready_at = std::max(lay.ready_at, t);
      trace_lane(self, s, g, "cnic", "h2d", static_cast<int32_t>(l), now, rx,
                 nominal, " rx");
    }
  }
  auto step = s.id;
  if (!loopback.writes.empty()) {
    ++lay.pushes_pending;
    auto hdl = caf::actor_cast<caf::actor>(self);
    auto early =
        post_or_complete(*cfg.node->bulk, std::move(loopback),
                         [hdl, step, l](bulk::completion c) {
                           caf::anon_send(hdl, posted_atom_v, step, l,
                                          loopback_post, std::move(c.error));
                         });
    if (early) {
      --lay.pushes_pending;
      if (early->error) {
        // Every request of the layer read through the failed copy.
        for (auto& lane : s.lanes)
          for (auto& c : lane.chunks)
            fail_request(self, c.plan.request_id, early->error);
      }
    }
  }
  for (auto& entry : pushes) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang).
    const auto de = entry.first;
    auto& batch = entry.second;
    ++lay.pushes_pending;
    lay.push_targets.push_back(de);
    auto ids = std::vector<uint64_t>{};
    for (auto& c : batch.chunks)
      ids.push_back(c.request_id);
    // Whether the push from `de` is still awaited (a lost engine's was
    // settled already); removes it.
    auto settle = [self, step, l, de] {
      auto* s = find_step(self, step);
      if (s == nullptr)
        return false;
      auto& targets = s->layers[l].push_targets;
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
              auto& s = *find_step(self, step);
              auto& lay = s.layers[l];
              auto now = emulated_now(self, cfg.time);
              auto t = std::max(now, from_ns(cfg.time, r.done_ns));
              for (auto& x : r.chunks) {
                auto* c = live_chunk(s, x.request_id);
                if (c == nullptr)
                  continue;
                auto nominal = nominal_tokens(cfg, x.tokens);
                auto rx = reserve(lane_link(cfg.node->cnic_rx, c->lane),
                                  nominal, now);
                t = std::max(t, rx);
                if (cfg.hooks && cfg.hooks->tracing())
                  span(cfg, "cnic", c->lane, "transfer", x.request_id,
                       static_cast<int32_t>(l), since_start(cfg.time, now),
                       since_start(cfg.time, rx), nominal, " rx");
              }
              lay.ready_at = std::max(lay.ready_at, t);
              --lay.pushes_pending;
              load_done(self, s, l);
            },
            [self, step, l, ids, settle](caf::error& err) {
              if (!settle())
                return;
              for (auto id : ids)
                fail_request(self, id, err);
              auto* s = find_step(self, step);
              if (s == nullptr)
                return;
              --s->layers[l].pushes_pending;
              load_done(self, *s, l);
            });
  }
  load_done(self, s, l);
}

// Schedules the compute of every layer whose loads are in, in order: a
// layer starts once the previous one ends and its KV is in (Basic: once
// every layer's is), and lasts the step's layer time on every GPU.
// The next step's first layer starts once the running step's last one
// ends.
void try_compute(self_ptr self, step_run& s) {
  auto& st = self->state;
  auto& cfg = st.cfg;
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
    if (l > 0) {
      start = std::max(start, s.layers[l - 1].compute_end);
    } else {
      start = std::max(start, s.began);
      if (is_next(self, s)) {
        auto& run = *st.step;
        if (run.next_compute < run.layers.size())
          return; // scheduled when the running step's last layer is
        start = std::max(start, run.layers.back().compute_end);
      }
    }
    lay.compute_end = start + gpu::to_duration(s.layer_s);
    lay.compute_scheduled = true;
    ++s.next_compute;
    auto now = emulated_now(self, cfg.time);
    self->delayed_send(self, cfg.time.to_actor(lay.compute_end - now),
                       computed_atom_v, s.id, l);
  }
  if (!is_next(self, s) && st.next)
    try_compute(self, *st.next);
}

void post_done(self_ptr self, step_run& s, uint32_t l) {
  auto& st = self->state;
  auto& lay = s.layers[l];
  if (lay.posts_pending > 0)
    return;
  send_at(self, st.cfg.time, lay.send_done, sent_atom_v, s.id, l);
}

// Layer l's KV of every chunk to its decode node: the new tokens, and with a
// request's first chunk its PE-side hits (decode-side hits are there
// already). One bulk batch per decode node, class kv, the GPU's cnic_tx.
void start_send(self_ptr self, step_run& s, uint32_t l) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& lay = s.layers[l];
  auto now = emulated_now(self, cfg.time);
  lay.send_done = now;
  if (!moves_bytes(cfg)) {
    post_done(self, s, l);
    return;
  }
  const auto bt = cfg.model.block_tokens;
  const auto unit = bpt(cfg);
  std::map<std::string, bulk::batch> batches;
  std::map<std::string, std::vector<uint64_t>> batch_requests;
  for (uint32_t g = 0; g < s.lanes.size(); ++g) {
    auto& lane = s.lanes[g];
    auto& staging = st.lanes[g];
    uint64_t tokens = 0;
    for (auto& c : lane.chunks) {
      if (c.failed)
        continue;
      auto& p = c.plan;
      for (auto [first, last] : sent_ranges(p)) {
        if (first >= last)
          continue;
        tokens += last - first;
        if (!cfg.real_bytes)
          continue;
        bool ok = true;
        for (auto& seg : block_segments(first, last - first, bt)) {
          if (seg.block >= p.slot.blocks.size()) {
            ok = false;
            break;
          }
          auto dst = p.slot.blocks[seg.block].subrange(
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
          fail_request(self, p.request_id,
                       caf::make_error(caf::sec::invalid_argument,
                                       "decode slot of request "
                                           + std::to_string(p.request_id)
                                           + " lacks a block"));
          break;
        }
        batch_requests[p.slot.blocks.front().node].push_back(p.request_id);
      }
    }
    if (tokens > 0) {
      auto nominal = nominal_tokens(cfg, tokens);
      auto tx = reserve(lane_link(cfg.node->cnic_tx, g), nominal, now);
      lay.send_done = std::max(lay.send_done, tx);
      trace_lane(self, s, g, "cnic", "send", static_cast<int32_t>(l), now, tx,
                 nominal, " tx");
    }
  }
  auto step = s.id;
  auto hdl = caf::actor_cast<caf::actor>(self);
  for (auto& [node, batch] : batches) {
    auto& ids = batch_requests[node];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    ++lay.posts_pending;
    batch.tag = (step << 16) | l;
    auto serial = st.next_send++;
    auto early = post_or_complete(*cfg.node->bulk, std::move(batch),
                                  [hdl, step, l, serial](bulk::completion c) {
                                    caf::anon_send(hdl, posted_atom_v, step, l,
                                                   serial, std::move(c.error));
                                  });
    if (early) {
      --lay.posts_pending;
      if (early->error)
        for (auto id : ids)
          fail_request(self, id, early->error);
      if (!current(self, step))
        return;
      continue;
    }
    for (auto id : ids)
      ++st.sends_of[id];
    st.sends.emplace(serial, std::move(ids));
  }
  post_done(self, s, l);
}

// Whether step `n`'s layers ahead fit every GPU's staging next to the
// running step `run`'s window, and its own window next to them (the bound on
// the GPU memory of both steps: the window slots of the larger step plus
// the slots ahead).
bool layer_ahead_fits(const std::vector<staging>& lanes, const step_run& run,
                      const step_run& n, uint32_t ahead) {
  for (uint32_t g = 0; g < n.lanes.size(); ++g) {
    uint64_t size = g < lanes.size() ? lanes[g].size : 0;
    uint64_t running = g < run.lanes.size()
                           ? uint64_t{run.window} * run.lanes[g].layer_bytes
                           : 0;
    uint64_t own = uint64_t{n.window} * n.lanes[g].layer_bytes;
    uint64_t slots = uint64_t{ahead} * n.lanes[g].layer_bytes;
    if (std::max(running, own) + slots > size)
      return false;
  }
  return true;
}

// A packed step's run: its chunks (the PE-side blocks' payloads found in
// their leases).
std::unique_ptr<step_run> make_run(self_ptr self, prefill_step& plan) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto s = std::make_unique<step_run>();
  s->id = plan.id;
  s->window = std::max<uint32_t>(plan.window, 1);
  s->layer_s = plan.layer_s;
  s->layers.resize(plan.layers);
  const auto bt = cfg.model.block_tokens;
  const uint64_t payload = uint64_t{bt} * cfg.model.layers * bpt(cfg);
  // Lanes past the node's GPUs have no staging: their chunks cannot run.
  auto lanes = std::min<size_t>(plan.lanes.size(), st.lanes.size());
  s->lanes.resize(lanes);
  for (uint32_t g = 0; g < lanes; ++g) {
    auto& in = plan.lanes[g];
    auto& out = s->lanes[g];
    out.layer_bytes = in.layer_bytes;
    out.chunks.reserve(in.chunks.size());
    for (auto& c : in.chunks) {
      chunk_run r;
      r.lane = g;
      if (cfg.real_bytes && bt > 0) {
        r.pe_block.assign(c.pe_side_tokens / bt, nullptr);
        for (auto& l : c.pe_leases)
          if (l.block_index < r.pe_block.size())
            r.pe_block[l.block_index] = lease_payload(l, payload);
      }
      r.plan = std::move(c);
      out.chunks.push_back(std::move(r));
    }
  }
  for (auto& lane : s->lanes)
    for (auto& c : lane.chunks)
      s->by_request.emplace(c.plan.request_id, &c);
  s->began = emulated_now(self, cfg.time);
  return s;
}

// A packed step arrives: while none runs it runs now, its first layers'
// loads start; while one runs it is the next step, its layers ahead load
// once the running step's loads are issued (if they fit the staging).
void on_step(self_ptr self, prefill_step& plan) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (st.step && st.next) {
    auto err =
        caf::make_error(caf::sec::runtime_error,
                        "layer streamer of " + cfg.node->name + ": step "
                            + std::to_string(plan.id) + " arrived while steps "
                            + std::to_string(st.step->id) + " and "
                            + std::to_string(st.next->id) + " are held");
    for (auto& lane : plan.lanes)
      for (auto& c : lane.chunks)
        self->send(st.engine, fail_atom_v, plan.id, c.request_id, err);
    self->send(st.engine, done_atom_v, plan.id);
    return;
  }
  auto s = make_run(self, plan);
  auto* run = s.get();
  if (st.step) {
    if (cfg.mode != load_mode::basic
        && layer_ahead_fits(st.lanes, *st.step, *s, layers_ahead)) {
      s->ahead = std::min<uint32_t>(layers_ahead, plan.layers);
      for (uint32_t g = 0; g < s->lanes.size(); ++g)
        s->lanes[g].ahead_base =
            st.lanes[g].size - uint64_t{s->ahead} * s->lanes[g].layer_bytes;
    }
    st.next = std::move(s);
  } else {
    st.step = std::move(s);
  }
  for (size_t g = run->lanes.size(); g < plan.lanes.size(); ++g)
    for (auto& c : plan.lanes[g].chunks)
      self->send(st.engine, fail_atom_v, plan.id, c.request_id,
                 caf::make_error(caf::sec::invalid_argument,
                                 "prefill step lane " + std::to_string(g)
                                     + " has no GPU on " + cfg.node->name));
  advance_loads(self, *run);
}

// A bulk batch of step `step`'s layer `l` completed: a load's loopback copy
// (serial loopback_post: every request of the layer read through it) or
// the send with `serial` (its requests, to one decode node).
void on_posted(self_ptr self, uint64_t step, uint32_t l, uint64_t serial,
               caf::error err) {
  const bool load = serial == loopback_post;
  auto sent = load ? std::vector<uint64_t>{} : send_ended(self, serial);
  auto* s = find_step(self, step);
  if (s == nullptr || l >= s->layers.size())
    return;
  if (err && load) {
    for (auto& lane : s->lanes)
      for (auto& c : lane.chunks)
        fail_request(self, c.plan.request_id, err);
  } else if (err) {
    for (auto id : sent)
      fail_request(self, id, err);
  }
  s = find_step(self, step);
  if (s == nullptr)
    return;
  auto& lay = s->layers[l];
  if (load) {
    --lay.pushes_pending;
    load_done(self, *s, l);
  } else {
    --lay.posts_pending;
    post_done(self, *s, l);
  }
}

// A decode engine was lost: its requests are skipped (the engine failed
// them already) and pushes awaited from it are settled, so both steps go
// on.
void on_lost(self_ptr self, const caf::actor_addr& de) {
  auto& st = self->state;
  std::vector<uint64_t> steps;
  for (auto* s : {st.step.get(), st.next.get()})
    if (s != nullptr)
      steps.push_back(s->id);
  for (auto id : steps) {
    auto* s = find_step(self, id);
    if (s == nullptr)
      continue;
    for (auto& lane : s->lanes)
      for (auto& c : lane.chunks)
        if (c.plan.decode_actor && c.plan.decode_actor.address() == de)
          c.failed = true;
    for (uint32_t l = 0; l < s->layers.size(); ++l) {
      s = find_step(self, id);
      if (s == nullptr)
        break;
      auto& lay = s->layers[l];
      auto i = std::find_if(
          lay.push_targets.begin(), lay.push_targets.end(),
          [&de](const caf::actor& x) { return x.address() == de; });
      if (i == lay.push_targets.end())
        continue;
      lay.push_targets.erase(i);
      --lay.pushes_pending;
      load_done(self, *s, l);
    }
  }
}

void on_computed(self_ptr self, uint64_t step, uint32_t l) {
  auto* sp = find_step(self, step);
  if (sp == nullptr)
    return;
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *sp;
  auto& lay = s.layers[l];
  const auto unit = bpt(cfg);
  if (copies_bytes(cfg)) {
    // The new tokens' KV of layer l (the deterministic content), and the
    // layer's KV into GPU memory.
    for (uint32_t g = 0; g < s.lanes.size(); ++g) {
      auto& lane = s.lanes[g];
      auto& staging = st.lanes[g];
      std::vector<gpu::copy_chunk> chunks;
      for (auto& c : lane.chunks) {
        if (c.failed)
          continue;
        auto& p = c.plan;
        auto off = staging_at(s, lane, c, l, p.first, unit);
        fill_tokens(p.hashes, cfg.model.block_tokens, l, p.first,
                    p.first + p.tokens, unit, staging.memory.get() + off);
        chunks.push_back(gpu::copy_chunk{staging_at(s, lane, c, l, 0, unit),
                                         p.offset,
                                         uint64_t{p.first + p.tokens} * unit});
      }
      if (!chunks.empty() && g < lay.gpu.size() && lay.gpu[g].valid()) {
        auto& dev = *cfg.devices[g];
        auto err =
            dev.copy_h2d(staging.pinned, lay.gpu[g], chunks, staging.stream);
        if (!err)
          err = dev.synchronize(staging.stream);
        if (err)
          for (auto& c : lane.chunks)
            fail_request(self, c.plan.request_id, err);
        if (!current(self, step))
          return;
      }
    }
  }
  if (cfg.hooks) {
    auto now = emulated_now(self, cfg.time);
    for (uint32_t g = 0; g < s.lanes.size(); ++g)
      trace_lane(self, s, g, "gpu", "compute", static_cast<int32_t>(l),
                 now - gpu::to_duration(s.layer_s), now);
    cfg.hooks->count("dualpath_prefill_layers_total",
                     {{"node", cfg.node->name}});
  }
  lay.computed = true;
  if (cfg.mode != load_mode::basic) {
    start_send(self, s, l);
  } else if (l + 1 == s.layers.size()) {
    // Basic: every layer's KV goes out once the whole prefill is done.
    for (uint32_t k = 0; k < s.layers.size(); ++k) {
      auto* x = find_step(self, step);
      if (x == nullptr)
        break;
      start_send(self, *x, k);
    }
  }
}

// The running step is sent: the engine is told, the next step runs alone
// now (its loads go on in its window), or ends at once if it is sent too.
void finish_running(self_ptr self) {
  auto& st = self->state;
  while (st.step && st.step->first_live == st.step->layers.size()) {
    auto done = st.step->id;
    st.step = std::move(st.next);
    hand_off(self, st.engine, done_atom_v, done);
  }
  if (st.step)
    advance_loads(self, *st.step);
}

void on_sent(self_ptr self, uint64_t step, uint32_t l) {
  auto* sp = find_step(self, step);
  if (sp == nullptr)
    return;
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& s = *sp;
  auto& lay = s.layers[l];
  // Tell each decode node what of layer l is in its buffer now.
  std::map<caf::actor, layer_batch> notes;
  auto done_ns = since_start(cfg.time, lay.send_done);
  for (auto& lane : s.lanes)
    for (auto& c : lane.chunks) {
      if (c.failed)
        continue;
      auto& p = c.plan;
      auto& note = notes[p.decode_actor];
      note.layer = l;
      note.done_ns = done_ns;
      for (auto [first, last] : sent_ranges(p)) {
        if (first >= last)
          continue;
        layer_chunk x;
        x.request_id = p.request_id;
        x.first_token = first;
        x.tokens = last - first;
        x.bytes = moves_bytes(cfg) ? uint64_t{x.tokens} * bpt(cfg) : 0;
        note.chunks.push_back(x);
      }
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
  if (!is_next(self, s) && s.first_live == s.layers.size()) {
    finish_running(self);
    return;
  }
  advance_loads(self, s);
}

caf::error make_staging(const engine_config& cfg, uint32_t g, staging& s) {
  s.size = real_bytes(cfg.hbm_kv_bytes, cfg.byte_scale);
  if (s.size == 0 || !copies_bytes(cfg))
    return {};
  // Page-aligned, not value-initialised: pages are touched only when KV
  // lands there.
  s.memory = gpu::allocate_host_memory(s.size);
  if (!s.memory)
    return caf::make_error(gpu::gpu_errc::out_of_memory,
                           "prefill staging of " + std::to_string(s.size)
                               + " B for GPU " + std::to_string(g)
                               + ": no host memory");
  if (auto& dev = cfg.devices[g]) {
    auto pinned = dev->pin(s.memory.get(), s.size);
    if (!pinned)
      return std::move(pinned.error());
    s.pinned = std::move(*pinned);
    auto stream = dev->make_stream();
    if (!stream)
      return std::move(stream.error());
    s.stream = std::move(*stream);
  }
  if (cfg.node && cfg.node->bulk) {
    auto reg = cfg.node->bulk->register_region(s.memory.get(), s.size);
    if (!reg)
      return std::move(reg.error());
    s.registration = std::move(*reg);
  }
  return {};
}

impl_actor::behavior_type
layer_streamer(self_ptr self, engine_config cfg, layer_streamer_reports engine,
               std::shared_ptr<std::vector<staging>> lanes) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.engine = std::move(engine);
  st.lanes = std::move(*lanes);
  // Its engine went down: the running step has no one to report to; the
  // decode nodes and the scheduler see the engine's loss themselves.
  self->monitor(st.engine);
  self->set_down_handler([self](const caf::down_msg& dm) {
    if (dm.source != self->state.engine.address())
      return;
    self->state.next.reset();
    self->state.step.reset();
    self->quit(dm.reason);
  });
  return {
      [self](run_step_atom, prefill_step& plan) { on_step(self, plan); },
      [self](lost_atom, const caf::actor_addr& de) { on_lost(self, de); },
      [self](computed_atom, uint64_t step, uint32_t l) {
        on_computed(self, step, l);
      },
      [self](sent_atom, uint64_t step, uint32_t l) { on_sent(self, step, l); },
      [self](posted_atom, uint64_t step, uint32_t l, uint64_t serial,
             caf::error& err) {
        on_posted(self, step, l, serial, std::move(err));
      },
  };
}

} // namespace

} // namespace dualpath::actors::streamer

namespace dualpath::actors {

caf::expected<layer_streamer_actor>
spawn_layer_streamer(caf::actor_system& sys, engine_config cfg,
                     layer_streamer_reports engine) {
  if (cfg.devices.size() < cfg.gpus || !cfg.node || !engine)
    return caf::make_error(caf::sec::invalid_argument,
                           "layer streamer needs its node, its prefill "
                           "engine and one device per GPU");
  // The staging (memory, pins, streams and their threads, registrations)
  // is made here, in the caller's thread: the streamer exists only with it.
  auto lanes = std::make_shared<std::vector<streamer::staging>>(cfg.gpus);
  for (uint32_t g = 0; g < cfg.gpus; ++g)
    if (auto err = streamer::make_staging(cfg, g, (*lanes)[g]))
      return err;
  return caf::actor_cast<layer_streamer_actor>(
      sys.spawn(streamer::layer_streamer, std::move(cfg), std::move(engine),
                std::move(lanes)));
}

} // namespace dualpath::actors
