#include "actors/engines/decode/decode_engine.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/bulk/bulk_post.hpp"
#include "actors/engines/engine_common.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/kv_content.hpp"

// Private atoms: messages the engine sends itself (timers, completions from
// backend threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, pushed_atom,
             "depushed")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, prefill_end_atom,
             "depfend")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, loaded_atom,
             "deloaded")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, step_atom,
             "destep")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, report_tick_atom,
             "detick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, kick_atom,
             "dekick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, on_gpu_atom,
             "deongpu")

namespace dualpath::actors {

namespace {

using namespace dualpath::actors::decode_atoms;

namespace bulk = transport::bulk;
namespace storage = transport::storage;

using time_point = emulated_time::time_point;

// The engine's whole interface: the public one plus its private messages.
using impl_actor = decode_engine_actor::extend<
    caf::reacts_to<pushed_atom, uint64_t, caf::error>,
    caf::reacts_to<prefill_end_atom, uint64_t>,
    caf::reacts_to<loaded_atom, uint64_t>, caf::reacts_to<step_atom, uint64_t>,
    caf::reacts_to<kick_atom>, caf::reacts_to<on_gpu_atom, uint64_t>,
    caf::reacts_to<report_tick_atom>>;

// Where a request is (see the header).
enum class de_phase : uint8_t {
  reading,
  waiting,
  reserving,
  receiving,
  finishing,
  loading,
  decoding,
  persisting,
};

// One request placed on one of the node's GPUs.
struct de_request {
  uint64_t id = 0;
  de_phase phase = de_phase::reading;
  assignment a;
  uint32_t lane = 0;
  uint32_t tokens = 0;
  uint32_t blocks = 0; // prompt blocks, a trailing partial one included
  std::vector<block_hash> hashes;
  // The node buffer's slots holding the prompt (real data plane: one region
  // per block; empty where nothing is held yet).
  std::vector<remote_region> block_region;
  // Every lease this request holds (reads and reservations), released at
  // once when the KV is in GPU memory or the request is dropped.
  std::vector<uint64_t> leases;
  std::vector<block_hash> read_failed;
  std::vector<caf::typed_response_promise<decode_slot>> admit_waiters;
  prefill_summary summary;
  bool summary_received = false;
  uint32_t expected = 0; // tokens per layer the prefill engine sends
  std::vector<uint32_t> layer_tokens;
  uint32_t layers_complete = 0;
  time_point last_arrival{};
  uint64_t hbm_commit = 0; // nominal bytes committed on its GPU
  uint64_t hbm_use = 0;    // nominal bytes in its GPU's memory now
  gpu::device_buffer gpu;
  // The H2D copy: its emulated time passed (loaded) / the device finished it
  // (and the Layer Block checksums, when verified there).
  bool h2d_timed = false;
  bool h2d_done = true;
  // The H2D copy's emulated progress: nominal bytes in all, layers of it
  // still to move over the node's DRAM and the GPU's cnic_rx.
  uint64_t h2d_nominal = 0;
  uint32_t h2d_layers_left = 0;
  uint32_t generated = 0; // decode steps done (tokens after the first)
  time_point first_token_at{};
  uint32_t persists_left = 0;
  request_result result;
};

// One GPU of the node.
struct de_lane {
  uint64_t committed = 0; // nominal HBM bytes of its requests (not done)
  uint64_t in_hbm = 0;    // nominal HBM bytes of its KV in GPU memory now
  uint32_t seq = 0;       // requests placed here and not done
  uint64_t tok = 0;       // their prompt tokens
  std::vector<uint64_t> running; // decoding
  std::vector<uint64_t> joining; // in GPU memory, join at the next step
  std::deque<uint64_t> hbm_wait; // complete, waiting for GPU memory
  gpu::stream stream;
  // The node's buffer registered for this GPU's copies (H2D sources, D2H
  // targets): GPU 0 registers it, the others share that registration.
  gpu::pinned_host pinned;
  // Verification on the GPU: the Layer Block checksums of one request at a
  // time land in `sums` (pinned), `done` marks the end of its copy and
  // checksums; `on_the_way` is that request.
  gpu::event done;
  gpu::host_memory sums;
  size_t sums_capacity = 0; // uint64_t values
  gpu::pinned_host sums_pinned;
  std::vector<uint64_t> expected; // the checksums its content must have
  std::optional<uint64_t> on_the_way;
};

struct persist_job {
  uint64_t request_id = 0;
  block_hash hash = 0;
  block_hash parent = 0;
  uint32_t block = 0;
  bool from_gpu = false; // a prompt block (its KV is in GPU memory)
};

struct pending_push {
  caf::typed_response_promise<layer_batch> rp;
  layer_batch reply;
};

struct decode_state {
  decode_state() = default;
  decode_state(const decode_state&) = delete;
  decode_state& operator=(const decode_state&) = delete;
  /// Waits for the copies still on a GPU stream (they read the buffer and
  /// write GPU memory that go away with the state), drops the shared
  /// registrations before the one they share and gives the persist slot back.
  /// In the destructor, not in an attached functor: CAF destroys a stateful
  /// actor's state before it runs the functors attached to it.
  ~decode_state();

  engine_config cfg;
  std::vector<de_lane> lanes;
  std::unordered_map<uint64_t, de_request> requests;
  // One slot of the node's buffer kept for persists (their source region).
  std::optional<uint32_t> persist_slot;
  uint64_t payload_real = 0; // real bytes of one Full Block payload
  // The group's decode step.
  bool stepping = false;
  bool kicked = false; // a step start is due (after this instant's joins)
  uint64_t step_id = 0;
  time_point step_began{};
  std::deque<persist_job> persists;
  bool persist_busy = false;
  std::unordered_map<uint64_t, pending_push> pushes;
  uint64_t next_tag = 1;
  static inline const char* name = "decode_engine";
};

decode_state::~decode_state() {
  for (uint32_t k = 0; k < lanes.size(); ++k)
    if (k < cfg.devices.size() && cfg.devices[k] && lanes[k].stream.valid())
      static_cast<void>(cfg.devices[k]->synchronize(lanes[k].stream));
  for (auto k = lanes.size(); k > 0; --k)
    lanes[k - 1].pinned = gpu::pinned_host{};
  if (persist_slot && cfg.node && cfg.node->pool)
    cfg.node->pool->release(*persist_slot);
}

using self_ptr = impl_actor::stateful_pointer<decode_state>;

uint64_t kv_bytes_per_token(const engine_config& cfg) {
  return cfg.model.nominal_bytes_per_token_layer * cfg.model.layers;
}

time_point reserve(const link_ptr& link, uint64_t nominal, time_point now) {
  return link && nominal > 0 ? link->reserve(nominal, now) : now;
}

const link_ptr& lane_link(const std::vector<link_ptr>& links, uint32_t rank) {
  static const link_ptr none;
  return rank < links.size() ? links[rank] : none;
}

// The payload bytes of a region of the node's pool in this process.
std::byte* local_bytes(const remote_region& r) {
  return reinterpret_cast<std::byte*>(r.base) + r.offset;
}

std::byte* pool_slot_payload(const decode_state& st, uint32_t slot) {
  return st.cfg.node->pool->slot(slot) + storage::header_bytes;
}

remote_region persist_source(const decode_state& st) {
  auto& reg = *st.cfg.node->pool_registration;
  auto d = reg.describe();
  d.offset =
      st.cfg.node->pool->offset_of(*st.persist_slot) + storage::header_bytes;
  d.length = st.payload_real;
  return d;
}

void trace(self_ptr self, const char* track, uint32_t lane, const char* name,
           uint64_t id, int64_t begin_ns, int64_t end_ns,
           uint64_t nominal_bytes = 0, const char* suffix = "") {
  span(self->state.cfg, track, lane, name, id, -1, begin_ns, end_ns,
       nominal_bytes, suffix);
}

void try_step(self_ptr self);
void try_load(self_ptr self, uint32_t lane);
void pump_persist(self_ptr self);

// -- placement and the decode-side read -------------------------------------

void release_leases(self_ptr self, de_request& r) {
  if (!r.leases.empty() && self->state.cfg.node->reader)
    self->send(self->state.cfg.node->reader, release_atom_v,
               lease_release{std::move(r.leases)});
  r.leases.clear();
}

// A request leaves (done or dropped): its GPU's counts and its buffer.
void forget(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  auto& lane = st.lanes[r.lane];
  lane.committed -= std::min(lane.committed, r.hbm_commit);
  lane.in_hbm -= std::min(lane.in_hbm, r.hbm_use);
  lane.seq -= std::min<uint32_t>(lane.seq, 1);
  lane.tok -= std::min<uint64_t>(lane.tok, r.tokens);
  auto drop = [id](std::vector<uint64_t>& xs) {
    xs.erase(std::remove(xs.begin(), xs.end(), id), xs.end());
  };
  drop(lane.running);
  drop(lane.joining);
  lane.hbm_wait.erase(
      std::remove(lane.hbm_wait.begin(), lane.hbm_wait.end(), id),
      lane.hbm_wait.end());
  release_leases(self, r);
  auto l = r.lane;
  st.requests.erase(i);
  try_load(self, l);
}

void reserve_rest(self_ptr self, de_request& r);

void on_read(self_ptr self, uint64_t id, read_completion c) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end() || i->second.phase != de_phase::reading) {
    // Dropped meanwhile: give the blocks back.
    std::vector<uint64_t> ids;
    for (auto& l : c.leases)
      ids.push_back(l.lease_id);
    if (!ids.empty())
      self->send(st.cfg.node->reader, release_atom_v,
                 lease_release{std::move(ids)});
    return;
  }
  auto& r = i->second;
  const auto& cfg = st.cfg;
  for (auto& l : c.leases) {
    r.leases.push_back(l.lease_id);
    if (cfg.real_bytes && l.block_index < r.blocks)
      r.block_region[l.block_index] = l.region;
    r.result.bytes_read_de +=
        uint64_t{l.blocks} * cfg.model.block_tokens * kv_bytes_per_token(cfg);
  }
  r.read_failed = std::move(c.failed);
  if (c.waited_for_buffer)
    ++r.result.buffer_waits;
  r.phase = de_phase::waiting;
  if (!r.admit_waiters.empty())
    reserve_rest(self, r);
}

// The request placed on GPU `a.decode.rank`: commit its HBM and start its
// decode-side read (assign from the scheduler, or an admit arriving first).
de_request& place(self_ptr self, const assignment& a) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto id = a.request.id;
  auto& r = st.requests[id];
  r.id = id;
  r.a = a;
  r.lane = std::min(a.decode.rank, cfg.gpus - 1);
  r.tokens = static_cast<uint32_t>(a.request.tokens.size());
  r.hashes = prompt_block_hashes(a.request.tokens, cfg.model.block_tokens);
  r.blocks = static_cast<uint32_t>(r.hashes.size());
  if (cfg.real_bytes)
    r.block_region.assign(r.blocks, remote_region{});
  r.layer_tokens.assign(cfg.model.layers, 0);
  r.hbm_commit =
      (uint64_t{r.tokens} + a.request.gen_tokens) * kv_bytes_per_token(cfg);
  r.result.id = id;
  r.result.prefill = a.prefill;
  r.result.decode = a.decode;
  auto& lane = st.lanes[r.lane];
  lane.committed += r.hbm_commit;
  ++lane.seq;
  lane.tok += r.tokens;
  auto plan = plan_for(cfg.mode, a.plan, r.tokens / cfg.model.block_tokens);
  if (moves_bytes(cfg) && plan.hit_blocks > plan.pe_side_blocks
      && cfg.node->reader) {
    read_request rr;
    rr.request_id = id;
    rr.blocks.assign(r.hashes.begin() + plan.pe_side_blocks,
                     r.hashes.begin() + plan.hit_blocks);
    rr.first_block = plan.pe_side_blocks;
    rr.tokens =
        (plan.hit_blocks - plan.pe_side_blocks) * cfg.model.block_tokens;
    read_blocks(
        self, cfg.node->reader, std::move(rr),
        [self, id](read_completion c) { on_read(self, id, std::move(c)); });
  } else {
    r.phase = de_phase::waiting;
  }
  return r;
}

// The slot: one region per block (reads' and reservations'), the failed
// decode-side blocks; every waiting admit gets it.
void answer_admits(de_request& r) {
  r.phase = de_phase::receiving;
  decode_slot slot;
  slot.request_id = r.id;
  slot.blocks = r.block_region;
  slot.failed = r.read_failed;
  for (auto& rp : r.admit_waiters)
    rp.deliver(slot);
  r.admit_waiters.clear();
}

// Reserves buffer slots for every block no read delivered.
void reserve_rest(self_ptr self, de_request& r) {
  auto& cfg = self->state.cfg;
  if (!moves_bytes(cfg)) {
    answer_admits(r); // Oracle: the KV is resident, nothing to hold
    return;
  }
  r.phase = de_phase::reserving;
  std::vector<bool> held(r.blocks, false);
  // Blocks the read delivered: their leases (real plane: regions; modeled:
  // runs, counted through the read's lease list at on_read).
  if (cfg.real_bytes) {
    for (uint32_t k = 0; k < r.blocks; ++k)
      held[k] = r.block_region[k].length > 0;
  } else {
    // Modeled: the read covered [pe_side, hit) but its failed blocks.
    auto plan = plan_for(cfg.mode, r.a.plan, r.tokens / cfg.model.block_tokens);
    for (uint32_t k = plan.pe_side_blocks; k < plan.hit_blocks; ++k)
      held[k] = true;
    for (auto h : r.read_failed)
      for (uint32_t k = plan.pe_side_blocks; k < plan.hit_blocks; ++k)
        if (r.hashes[k] == h)
          held[k] = false;
  }
  reserve_request rq;
  rq.request_id = r.id;
  for (uint32_t k = 0; k < r.blocks; ++k)
    if (!held[k])
      rq.block_indices.push_back(k);
  auto id = r.id;
  self->request(cfg.node->reader, caf::infinite, reserve_atom_v, std::move(rq))
      .then(
          [self, id](read_completion& c) {
            auto& st = self->state;
            auto i = st.requests.find(id);
            if (i == st.requests.end()
                || i->second.phase != de_phase::reserving) {
              std::vector<uint64_t> ids;
              for (auto& l : c.leases)
                ids.push_back(l.lease_id);
              self->send(st.cfg.node->reader, release_atom_v,
                         lease_release{std::move(ids)});
              return;
            }
            auto& r = i->second;
            if (c.waited_for_buffer)
              ++r.result.buffer_waits;
            for (auto& l : c.leases) {
              r.leases.push_back(l.lease_id);
              if (st.cfg.real_bytes && l.block_index < r.blocks)
                r.block_region[l.block_index] = l.region;
            }
            answer_admits(r);
          },
          [self, id](caf::error& err) {
            auto& st = self->state;
            auto i = st.requests.find(id);
            if (i == st.requests.end())
              return;
            for (auto& rp : i->second.admit_waiters)
              rp.deliver(err);
            i->second.admit_waiters.clear();
            forget(self, id);
          });
}

// -- the KV the prefill engine sends -----------------------------------------

void check_complete(self_ptr self, de_request& r) {
  auto& cfg = self->state.cfg;
  if (r.phase != de_phase::receiving || !r.summary_received
      || r.layers_complete < cfg.model.layers)
    return;
  r.phase = de_phase::finishing;
  send_at(self, cfg.time, r.last_arrival, prefill_end_atom_v, r.id);
}

void on_layer(self_ptr self, const layer_batch& b) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (b.layer >= cfg.model.layers)
    return;
  auto now = emulated_now(self, cfg.time);
  auto sent = std::max(now, from_ns(cfg.time, b.done_ns));
  for (auto& c : b.chunks) {
    auto i = st.requests.find(c.request_id);
    if (i == st.requests.end())
      continue;
    auto& r = i->second;
    auto t = sent;
    auto nominal = nominal_of_real(c.bytes, cfg.model);
    if (nominal > 0) {
      auto& link = lane_link(cfg.node->cnic_rx, r.lane);
      auto rx = reserve(link, nominal, now);
      t = std::max({t, reserve(cfg.node->dram, nominal, now), rx});
      r.result.bytes_pe_to_de += nominal;
      if (link && link->rate() > 0 && cfg.hooks && cfg.hooks->tracing()) {
        // The layer's arrival: this NIC's window for its bytes, the end of
        // the flow from the prefill engine's send (timeline).
        auto busy = std::chrono::nanoseconds(
            static_cast<int64_t>(static_cast<double>(nominal) * 1e9
                                 / static_cast<double>(link->rate())));
        span(cfg, "cnic", r.lane, "receive", r.id,
             static_cast<int32_t>(b.layer),
             since_start(cfg.time, std::max(now, rx - busy)),
             since_start(cfg.time, rx), nominal, " rx");
      }
    }
    r.last_arrival = std::max(r.last_arrival, t);
    auto& got = r.layer_tokens[b.layer];
    bool was_complete = r.summary_received && got >= r.expected;
    got += c.tokens;
    if (r.summary_received && !was_complete && got >= r.expected)
      ++r.layers_complete;
    check_complete(self, r);
  }
}

void on_summary(self_ptr self, const prefill_summary& s) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.requests.find(s.request_id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  const auto bt = cfg.model.block_tokens;
  r.summary = s;
  r.summary_received = true;
  // This node's own tokens are the decode-side hits the prefill engine uses.
  auto own = s.hit_blocks > s.pe_side_blocks
                 ? uint64_t{s.hit_blocks - s.pe_side_blocks} * bt
                 : 0;
  r.expected =
      static_cast<uint32_t>(r.tokens - std::min<uint64_t>(own, r.tokens));
  r.layers_complete = 0;
  for (auto got : r.layer_tokens)
    if (got >= r.expected)
      ++r.layers_complete;
  check_complete(self, r);
}

// -- decode-side tokens pushed to a prefill GPU ------------------------------

caf::result<layer_batch> on_push(self_ptr self, layer_batch& b) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  const auto bt = cfg.model.block_tokens;
  const auto unit = bpt(cfg);
  auto now = emulated_now(self, cfg.time);
  auto done = now;
  layer_batch reply;
  reply.layer = b.layer;
  bulk::batch out;
  out.tclass = transport::traffic_class::kv;
  for (auto& c : b.chunks) {
    auto i = st.requests.find(c.request_id);
    if (i == st.requests.end() || b.layer >= cfg.model.layers)
      return caf::make_error(caf::sec::invalid_argument,
                             "push for unknown request "
                                 + std::to_string(c.request_id));
    auto& r = i->second;
    uint64_t nominal =
        uint64_t{c.tokens} * cfg.model.nominal_bytes_per_token_layer;
    layer_chunk moved = c;
    moved.destination = remote_region{};
    moved.bytes = 0;
    if (cfg.real_bytes && c.tokens > 0) {
      for (auto& seg : block_segments(c.first_token, c.tokens, bt)) {
        if (seg.block >= r.blocks || r.block_region[seg.block].length == 0)
          return caf::make_error(caf::sec::invalid_argument,
                                 "push of block " + std::to_string(seg.block)
                                     + " not in the buffer");
        auto src_off = r.block_region[seg.block].offset
                       + block_offset(b.layer, seg.token_in_block, bt, unit);
        auto dst = c.destination.subrange(
            uint64_t{seg.first_token - c.first_token} * unit,
            uint64_t{seg.tokens} * unit);
        if (!dst)
          return std::move(dst.error());
        out.writes.push_back(
            bulk::write_request{cfg.node->pool_registration, src_off, *dst});
        moved.bytes += uint64_t{seg.tokens} * unit;
      }
    } else {
      moved.bytes = uint64_t{c.tokens} * unit;
    }
    if (nominal > 0) {
      done = std::max(
          {done, reserve(cfg.node->dram, nominal, now),
           reserve(lane_link(cfg.node->cnic_tx, r.lane), nominal, now)});
      r.result.bytes_de_to_pe += nominal;
    }
    reply.chunks.push_back(std::move(moved));
  }
  reply.done_ns = since_start(cfg.time, done);
  if (out.writes.empty())
    return reply;
  auto tag = st.next_tag++;
  out.tag = tag;
  auto rp = self->make_response_promise<layer_batch>();
  st.pushes.emplace(tag, pending_push{rp, std::move(reply)});
  auto hdl = caf::actor_cast<caf::actor>(self);
  auto early = post_or_complete(
      *cfg.node->bulk, std::move(out), [hdl, tag](bulk::completion c) {
        caf::anon_send(hdl, pushed_atom_v, tag, std::move(c.error));
      });
  if (early) {
    auto j = st.pushes.find(tag);
    if (early->error)
      j->second.rp.deliver(std::move(early->error));
    else
      j->second.rp.deliver(std::move(j->second.reply));
    st.pushes.erase(j);
  }
  return rp;
}

void on_pushed(self_ptr self, uint64_t tag, caf::error error) {
  auto& st = self->state;
  auto i = st.pushes.find(tag);
  if (i == st.pushes.end())
    return;
  if (error)
    i->second.rp.deliver(std::move(error)); // the transport's own error
  else
    i->second.rp.deliver(std::move(i->second.reply));
  st.pushes.erase(i);
}

// -- prefill end: verify, into GPU memory, decode ---------------------------

// Whether GPU `lane` checksums the prompts copied into its memory (and the
// node buffer's copy is not read again by the host).
bool verifies_on_device(const decode_state& st, uint32_t lane) {
  const auto& cfg = st.cfg;
  return cfg.verify_kv && cfg.real_bytes && moves_bytes(cfg)
         && lane < cfg.devices.size() && cfg.devices[lane]
         && st.lanes[lane].done.valid();
}

// Verifies the prompt KV byte for byte where it is in the node's buffer
// (Oracle: the content the model computes, the KV being resident).
void verify_in_buffer(self_ptr self, de_request& r) {
  auto& cfg = self->state.cfg;
  const auto bt = cfg.model.block_tokens;
  std::vector<std::byte> scratch;
  for (uint32_t k = 0; k < r.blocks; ++k) {
    const std::byte* p = nullptr;
    if (moves_bytes(cfg)) {
      if (k < r.block_region.size() && r.block_region[k].length > 0)
        p = local_bytes(r.block_region[k]);
    } else {
      scratch.resize(uint64_t{bt} * cfg.model.layers * bpt(cfg));
      fill_block(r.hashes, k, bt, cfg.model.layers, r.tokens, bpt(cfg),
                 scratch.data());
      p = scratch.data();
    }
    if (p != nullptr
        && check_block(r.hashes, k, bt, cfg.model.layers, r.tokens, bpt(cfg),
                       p))
      ++r.result.blocks_verified;
    else
      ++r.result.verify_failures;
  }
}

// Compares the Layer Block checksums GPU `r.lane` computed with the ones
// r's content must have.
void verify_on_device(self_ptr self, de_request& r) {
  auto& lane = self->state.lanes[r.lane];
  auto tally = check_prompt_checksums(
      lane.expected, reinterpret_cast<const uint64_t*>(lane.sums.get()),
      self->state.cfg.model.layers, r.blocks);
  r.result.blocks_verified += tally.ok;
  r.result.verify_failures += tally.failed;
}

// Room for `count` checksums in `lane`'s pinned results (grown on demand:
// the largest prompt so far).
caf::error sums_room(gpu::device& dev, de_lane& lane, size_t count) {
  if (count <= lane.sums_capacity)
    return {};
  lane.sums_pinned = gpu::pinned_host{};
  lane.sums = gpu::allocate_host_memory(count * sizeof(uint64_t));
  lane.sums_capacity = 0;
  if (!lane.sums)
    return caf::make_error(gpu::gpu_errc::out_of_memory,
                           "checksum results: no host memory");
  auto pinned = dev.pin(lane.sums.get(), count * sizeof(uint64_t));
  if (!pinned)
    return std::move(pinned.error());
  lane.sums_pinned = std::move(*pinned);
  lane.sums_capacity = count;
  return {};
}

// Submits r's prompt KV, node buffer -> its GPU's memory, and, when
// verifying there, the Layer Block checksums, then the event whose notice
// (on_gpu) says the copy is done. False when nothing is in flight (the
// device refused, the failure counted and the buffer verified instead; or,
// under the deterministic test scheduler, the work was waited for here).
bool submit_to_gpu(self_ptr self, de_request& r) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& lane = st.lanes[r.lane];
  auto& dev = *cfg.devices[r.lane];
  std::vector<gpu::copy_chunk> chunks;
  auto base = reinterpret_cast<uint64_t>(cfg.node->pool->base());
  for (uint32_t k = 0; k < r.blocks; ++k)
    if (r.block_region[k].length > 0)
      chunks.push_back(
          gpu::copy_chunk{static_cast<size_t>(r.block_region[k].base - base
                                              + r.block_region[k].offset),
                          size_t{k} * st.payload_real, st.payload_real});
  auto err = dev.copy_h2d(lane.pinned, r.gpu, chunks, lane.stream);
  const bool verify = verifies_on_device(st, r.lane);
  auto grids =
      grids_of(cfg.model.block_tokens, cfg.model.layers, r.tokens, bpt(cfg));
  if (!err && verify)
    err = sums_room(dev, lane, grids.count());
  if (!err && verify && grids.full.count() > 0)
    err = dev.enqueue_checksums(r.gpu, grids.full, lane.sums_pinned, 0,
                                lane.stream);
  if (!err && verify && grids.partial.count() > 0)
    err = dev.enqueue_checksums(r.gpu, grids.partial, lane.sums_pinned,
                                grids.full.count() * sizeof(uint64_t),
                                lane.stream);
  if (!err)
    err = dev.record(lane.done, lane.stream);
  const bool in_place = waits_for_device_in_place(self->home_system());
  if (!err && !in_place) {
    auto hdl = caf::actor_cast<caf::actor>(self);
    err = dev.notify(lane.done, lane.stream, [hdl, id = r.id] {
      caf::anon_send(hdl, on_gpu_atom_v, id);
    });
  }
  if (!err && in_place)
    err = dev.synchronize(lane.done);
  if (err) {
    // Nothing (more) completes: wait for what was submitted, then verify
    // where the bytes still are.
    static_cast<void>(dev.synchronize(lane.stream));
    r.result.verify_failures += 1;
    if (verify)
      verify_in_buffer(self, r);
    return false;
  }
  // The expected checksums, computed while the device works.
  if (verify)
    lane.expected = prompt_checksums(r.hashes, cfg.model.block_tokens,
                                     cfg.model.layers, r.tokens, bpt(cfg));
  if (in_place) {
    if (verify)
      verify_on_device(self, r);
    return false;
  }
  lane.on_the_way = r.id;
  return true;
}

void on_prefill_end(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.requests.find(id);
  if (i == st.requests.end() || i->second.phase != de_phase::finishing)
    return;
  auto& r = i->second;
  auto now = emulated_now(self, cfg.time);
  r.first_token_at = now;
  r.result.ttft_ns = since_start(cfg.time, now) - r.a.request.arrival_ns;
  if (cfg.verify_kv && !verifies_on_device(st, r.lane))
    verify_in_buffer(self, r);
  r.phase = de_phase::loading;
  st.lanes[r.lane].hbm_wait.push_back(id);
  try_load(self, r.lane);
}

// Times the next layer of r's H2D copy (node buffer -> GPU memory, over the
// node's DRAM and the GPU's cnic_rx) from `now`; returns when it ends. The
// copy is paced one layer at a time, the next reserved when the previous
// ends, as a DMA engine moves it: in bounded chunks with a few in flight,
// which the memory controller and the NIC interleave with the other traffic
// (layers arriving from prefill nodes, pushes to prefill GPUs). Reserving the
// whole prompt at once would put every arrival behind it (the pacers are
// FIFO), ~10 ms of a 62.5 GB/s DRAM for a 0.6 GB prompt.
time_point h2d_next_layer(self_ptr self, de_request& r, time_point now) {
  auto& cfg = self->state.cfg;
  const uint32_t layers = std::max<uint32_t>(cfg.model.layers, 1);
  const uint32_t k = layers - r.h2d_layers_left; // the layer timed now
  --r.h2d_layers_left;
  // Layer k's share, exact in sum: the bytes up to k + 1 minus those up to k.
  auto upto = [&](uint32_t n) {
    return r.h2d_nominal / layers * n + r.h2d_nominal % layers * n / layers;
  };
  const uint64_t nominal = upto(k + 1) - upto(k);
  auto t = now;
  if (nominal == 0)
    return t;
  auto& link = lane_link(cfg.node->cnic_rx, r.lane);
  auto rx = reserve(link, nominal, now);
  t = std::max({t, reserve(cfg.node->dram, nominal, now), rx});
  if (link && link->rate() > 0 && cfg.hooks && cfg.hooks->tracing()) {
    auto busy = std::chrono::nanoseconds(
        static_cast<int64_t>(double(nominal) * 1e9 / double(link->rate())));
    // One slice of the prompt's copy per layer, without a layer number: it
    // is the decode GPU's load of the whole prompt, not a step of the
    // prefill's layer pipeline (whose per-layer h2d carries the layer).
    span(cfg, "cnic", r.lane, "h2d", r.id, -1,
         since_start(cfg.time, std::max(now, rx - busy)),
         since_start(cfg.time, rx), nominal, " rx");
  }
  return t;
}

// Copies complete prompts into GPU `lane`'s memory while it has room.
void try_load(self_ptr self, uint32_t lane_index) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& lane = st.lanes[lane_index];
  while (!lane.hbm_wait.empty() && !lane.on_the_way) {
    auto id = lane.hbm_wait.front();
    auto i = st.requests.find(id);
    if (i == st.requests.end()) {
      lane.hbm_wait.pop_front();
      continue;
    }
    auto& r = i->second;
    uint64_t need = r.hbm_commit;
    if (lane.in_hbm > 0 && lane.in_hbm + need > cfg.hbm_kv_bytes)
      return; // wait for another sequence to finish
    lane.hbm_wait.pop_front();
    r.hbm_use = need;
    lane.in_hbm += need;
    auto now = emulated_now(self, cfg.time);
    r.h2d_nominal = uint64_t{r.tokens} * kv_bytes_per_token(cfg);
    r.h2d_layers_left = moves_bytes(cfg) && r.h2d_nominal > 0
                            ? std::max<uint32_t>(cfg.model.layers, 1)
                            : 0;
    auto t = r.h2d_layers_left > 0 ? h2d_next_layer(self, r, now) : now;
    auto& dev = cfg.devices[r.lane];
    r.h2d_timed = false;
    r.h2d_done = true;
    if (cfg.real_bytes && moves_bytes(cfg) && dev) {
      auto buf = dev->allocate(uint64_t{r.blocks} * st.payload_real);
      if (!buf) {
        r.result.verify_failures += 1; // the KV never reached GPU memory
        if (verifies_on_device(st, r.lane))
          verify_in_buffer(self, r);
      } else {
        r.gpu = std::move(*buf);
        r.h2d_done = !submit_to_gpu(self, r);
      }
    }
    send_at(self, cfg.time, t, loaded_atom_v, id);
    if (!r.h2d_done)
      return; // one prompt on its way to this GPU at a time (its checksums)
  }
}

// r's KV is in GPU memory (emulated time passed and the device is done):
// the node's buffer slots go back and it joins the next decode step.
void join(self_ptr self, de_request& r) {
  auto& st = self->state;
  release_leases(self, r);
  r.block_region.clear();
  r.phase = de_phase::decoding;
  st.lanes[r.lane].joining.push_back(r.id);
  // The step starts after the messages already queued: sequences that reach
  // GPU memory at the same instant join the same step.
  if (!st.stepping && !st.kicked) {
    st.kicked = true;
    self->send(self, kick_atom_v);
  }
}

void on_loaded(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end() || i->second.phase != de_phase::loading)
    return;
  auto& r = i->second;
  if (r.h2d_layers_left > 0) {
    // A layer of its copy is in GPU memory: the next one.
    auto now = emulated_now(self, self->state.cfg.time);
    send_at(self, self->state.cfg.time, h2d_next_layer(self, r, now),
            loaded_atom_v, id);
    return;
  }
  r.h2d_timed = true;
  if (r.h2d_done)
    join(self, r);
}

// The device finished request `id`'s copy (and checksums).
void on_gpu(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  auto& lane = st.lanes[r.lane];
  if (lane.on_the_way != id)
    return;
  lane.on_the_way.reset();
  if (verifies_on_device(st, r.lane))
    verify_on_device(self, r);
  r.h2d_done = true;
  auto l = r.lane;
  if (r.h2d_timed && r.phase == de_phase::loading)
    join(self, r);
  try_load(self, l);
}

void on_decode_end(self_ptr self, de_request& r);

// Starts the group's next decode step if any GPU has sequences.
void try_step(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (st.stepping)
    return;
  std::vector<std::vector<uint64_t>> contexts(st.lanes.size());
  bool any = false;
  // Sequences with one token to make need no step (gen_tokens <= 1); they
  // end after the loop (ending changes the lanes' lists).
  std::vector<uint64_t> ended;
  for (auto& lane : st.lanes) {
    for (auto id : lane.joining) {
      auto& r = st.requests.at(id);
      if (r.a.request.gen_tokens <= 1)
        ended.push_back(id);
      else
        lane.running.push_back(id);
    }
    lane.joining.clear();
  }
  for (auto id : ended)
    on_decode_end(self, st.requests.at(id));
  if (st.stepping)
    return; // an ending request's persist may have started a step
  for (size_t g = 0; g < st.lanes.size(); ++g) {
    auto& lane = st.lanes[g];
    for (auto id : lane.running) {
      auto& r = st.requests.at(id);
      contexts[g].push_back(uint64_t{r.tokens} + r.generated);
    }
    any = any || !lane.running.empty();
  }
  if (!any)
    return;
  auto step = decode_step(cfg, contexts);
  if (auto& stats = cfg.stats) {
    ++stats->steps;
    for (auto& c : contexts) {
      stats->tokens += c.size();
      stats->batch(c.size());
    }
  }
  st.stepping = true;
  ++st.step_id;
  st.step_began = emulated_now(self, cfg.time);
  self->delayed_send(self, cfg.time.to_actor(gpu::to_duration(step.tpot_s)),
                     step_atom_v, st.step_id);
}

void on_step(self_ptr self, uint64_t step) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (step != st.step_id || !st.stepping)
    return;
  st.stepping = false;
  auto now = emulated_now(self, cfg.time);
  std::vector<uint64_t> ended; // ended after the loop (it changes the lanes)
  for (size_t g = 0; g < st.lanes.size(); ++g) {
    auto& lane = st.lanes[g];
    std::vector<uint64_t> still;
    for (auto id : lane.running) {
      auto& r = st.requests.at(id);
      ++r.generated;
      if (r.generated == 1)
        r.result.ttst_ns = since_start(cfg.time, now) - r.a.request.arrival_ns;
      if (r.generated + 1 >= r.a.request.gen_tokens) {
        auto steps = r.a.request.gen_tokens - 1;
        r.result.tpot_ns = to_ns(now - r.first_token_at) / std::max(steps, 1u);
        r.result.done_ns = since_start(cfg.time, now);
        trace(self, "gpu", r.lane, "generate", id,
              since_start(cfg.time, r.first_token_at), r.result.done_ns);
        ended.push_back(id);
      } else {
        still.push_back(id);
      }
    }
    lane.running = std::move(still);
  }
  for (auto id : ended)
    on_decode_end(self, st.requests.at(id));
  try_step(self);
}

// -- persist and done --------------------------------------------------------

void send_done(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  r.result.bytes_read_pe = r.summary.bytes_read_pe;
  r.result.recomputed_blocks = r.summary.recomputed_blocks;
  r.result.buffer_waits += r.summary.buffer_waits;
  r.result.control_rtt_ns = r.summary.control_rtt_ns;
  r.result.bytes_compute_net =
      r.result.bytes_pe_to_de + r.result.bytes_de_to_pe;
  if (r.result.done_ns == 0)
    r.result.done_ns =
        since_start(st.cfg.time, emulated_now(self, st.cfg.time));
  auto result = r.result;
  if (st.cfg.hooks && st.cfg.hooks->tracing()) {
    auto now = since_start(st.cfg.time, emulated_now(self, st.cfg.time));
    if (result.blocks_persisted > 0)
      trace(self, "gpu", r.lane, "persist", id, result.done_ns, now);
    trace(self, "gpu", r.lane, "decode", id,
          r.a.request.arrival_ns + result.ttft_ns, now);
  }
  forget(self, id);
  if (st.cfg.scheduler)
    self->send(caf::actor_cast<scheduler_actor>(st.cfg.scheduler), done_atom_v,
               std::move(result));
}

void on_decode_end(self_ptr self, de_request& r) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  r.phase = de_phase::persisting;
  if (r.result.done_ns == 0)
    r.result.done_ns = since_start(cfg.time, emulated_now(self, cfg.time));
  const auto bt = cfg.model.block_tokens;
  auto& prompt = r.a.request.tokens;
  auto& output = r.a.request.output_tokens;
  if (!moves_bytes(cfg)) {
    std::vector<uint32_t> seq = prompt.to_vector();
    seq.insert(seq.end(), output.begin(), output.end());
    // Oracle bypasses I/O, not caching: the blocks the other modes persist
    // are stored at once, without time, so the agent's next turn finds the
    // same hits.
    if (cfg.node && cfg.node->store)
      if (auto stats = storage::populate(*cfg.node->store, {seq}))
        r.result.blocks_persisted += static_cast<uint32_t>(stats->written);
    send_done(self, r.id);
    return;
  }
  if (r.result.verify_failures > 0) {
    // KV that failed its check never reaches the store: a later turn would
    // read it as a hit.
    send_done(self, r.id);
    return;
  }
  // The full blocks of prompt + output from the first one not read from
  // storage: the prompt's own were hashed at placement; only the blocks from
  // the prompt's partial tail on are hashed here.
  uint32_t prompt_full = r.tokens / bt;
  uint64_t total = r.tokens + output.size();
  uint64_t blocks = bt > 0 ? total / bt : 0;
  auto token = [&](uint64_t k) {
    return k < prompt.size() ? prompt[k] : output[k - prompt.size()];
  };
  std::vector<uint32_t> block(bt);
  uint32_t first = std::min(r.summary.hit_blocks, prompt_full);
  auto parent = first > 0 ? r.hashes[first - 1] : transport::root_hash;
  for (uint64_t b = first; b < blocks; ++b) {
    block_hash h;
    if (b < prompt_full) {
      h = r.hashes[b];
    } else {
      for (uint32_t t = 0; t < bt; ++t)
        block[t] = token(b * bt + t);
      h = storage::chain_hash(parent, block.data(), bt);
    }
    persist_job job;
    job.request_id = r.id;
    job.hash = h;
    job.parent = parent;
    job.block = static_cast<uint32_t>(b);
    job.from_gpu = b < prompt_full;
    st.persists.push_back(job);
    ++r.persists_left;
    parent = h;
  }
  if (r.persists_left == 0) {
    send_done(self, r.id);
    return;
  }
  pump_persist(self);
}

void persist_done(self_ptr self, uint64_t id, uint32_t written, uint32_t jobs) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  i->second.result.blocks_persisted += written;
  i->second.persists_left -= std::min(i->second.persists_left, jobs);
  if (i->second.persists_left == 0)
    send_done(self, id);
}

// The modeled data plane's persist: a request's chain of blocks at the
// queue's front as one persist_batch (generated content, nothing to copy).
void pump_persist_batch(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto id = st.persists.front().request_id;
  persist_batch batch;
  batch.parent = st.persists.front().parent;
  batch.tokens = cfg.model.block_tokens;
  for (auto& job : st.persists) {
    if (job.request_id != id || batch.hashes.size() == max_persist_batch
        || (!batch.hashes.empty() && job.parent != batch.hashes.back()))
      break;
    batch.hashes.push_back(job.hash);
  }
  auto n = static_cast<uint32_t>(batch.hashes.size());
  st.persist_busy = true;
  auto done = [self, id, n](uint32_t written) {
    auto& st = self->state;
    st.persist_busy = false;
    for (uint32_t k = 0; k < n && !st.persists.empty(); ++k)
      st.persists.pop_front();
    persist_done(self, id, written, n);
    pump_persist(self);
  };
  self->request(cfg.node->reader, caf::infinite, persist_atom_v,
                std::move(batch))
      .then([done](uint32_t written) { done(written); },
            [done](caf::error&) { done(0); });
}

void pump_persist(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  if (st.persist_busy || st.persists.empty())
    return;
  auto job = st.persists.front();
  auto i = st.requests.find(job.request_id);
  if (i == st.requests.end()) {
    st.persists.pop_front();
    pump_persist(self);
    return;
  }
  if (!cfg.real_bytes) {
    pump_persist_batch(self);
    return;
  }
  auto& r = i->second;
  const auto bt = cfg.model.block_tokens;
  const uint64_t layer_block = uint64_t{bt} * bpt(cfg);
  std::byte* dst = pool_slot_payload(st, *st.persist_slot);
  bool copied = false;
  auto& dev = cfg.devices[r.lane];
  if (job.from_gpu && r.gpu.valid() && dev) {
    // GPU -> host DRAM: the block's payload (Full Block layout in GPU
    // memory as in the buffer).
    auto slot_off = static_cast<size_t>(
        cfg.node->pool->offset_of(*st.persist_slot) + storage::header_bytes);
    auto err =
        dev->copy_d2h(r.gpu, st.lanes[r.lane].pinned,
                      {gpu::copy_chunk{size_t{job.block} * st.payload_real,
                                       slot_off, st.payload_real}},
                      st.lanes[r.lane].stream);
    if (!err)
      err = dev->synchronize(st.lanes[r.lane].stream);
    copied = !err;
  }
  if (!copied)
    for (uint32_t l = 0; l < cfg.model.layers; ++l)
      storage::kv_fill_layer(job.hash, l, bt, bpt(cfg), dst + l * layer_block);
  st.persist_busy = true;
  auto id = job.request_id;
  auto done = [self, id](bool ok) {
    auto& st = self->state;
    st.persist_busy = false;
    if (!st.persists.empty())
      st.persists.pop_front();
    persist_done(self, id, ok ? 1 : 0, 1);
    pump_persist(self);
  };
  self->request(cfg.node->reader, caf::infinite, persist_atom_v,
                persist_request{job.hash, job.parent, bt, persist_source(st)})
      .then([done](block_hash) { done(true); },
            [done](caf::error&) { done(false); });
}

// -- loads and reports -------------------------------------------------------

group_report group_load(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  group_report g;
  g.group = cfg.group;
  g.role = engine_role::decode;
  auto q = read_queue_of(cfg);
  for (uint32_t k = 0; k < st.lanes.size(); ++k) {
    auto& lane = st.lanes[k];
    auto free = cfg.hbm_kv_bytes > lane.committed
                    ? cfg.hbm_kv_bytes - lane.committed
                    : 0;
    auto x = lane_load(cfg, k, lane.seq, lane.tok, free);
    x.read_q_tokens = q.tokens;
    x.read_q_bytes = q.bytes;
    g.engines.push_back(x);
  }
  return g;
}

void schedule_report(self_ptr self) {
  auto& cfg = self->state.cfg;
  self->delayed_send(
      self, cfg.time.to_actor(std::chrono::nanoseconds(cfg.fetch_period_ns)),
      report_tick_atom_v);
}

// Drops the requests `which` selects (their prefill engine is gone or gave
// up on them): admit waiters get `why`, buffer and HBM are freed. A read or
// reservation still in flight finds no request and gives its slots back.
template <class Predicate>
void drop_requests(self_ptr self, Predicate which, const caf::error& why) {
  auto& st = self->state;
  std::vector<uint64_t> dropped;
  for (auto& [id, r] : st.requests)
    if (r.phase < de_phase::finishing && which(r.a))
      dropped.push_back(id);
  for (auto id : dropped) {
    auto& r = st.requests.at(id);
    for (auto& rp : r.admit_waiters)
      rp.deliver(why);
    r.admit_waiters.clear();
    forget(self, id);
  }
}

caf::error setup(decode_state& st) {
  auto& cfg = st.cfg;
  if (!cfg.node)
    return caf::make_error(caf::sec::invalid_argument,
                           "decode engine needs its node");
  if (moves_bytes(cfg) && (!cfg.node->pool || !cfg.node->reader))
    return caf::make_error(caf::sec::invalid_argument,
                           "decode engine needs its node's buffer pool and "
                           "reader");
  if (cfg.devices.size() < cfg.gpus)
    return caf::make_error(caf::sec::invalid_argument,
                           "decode engine needs one device per GPU");
  st.payload_real =
      uint64_t{cfg.model.block_tokens} * cfg.model.layers * bpt(cfg);
  st.lanes.resize(cfg.gpus);
  if (copies_bytes(cfg)) {
    if (!cfg.node->pool_registration)
      return caf::make_error(caf::sec::invalid_argument,
                             "decode engine needs its buffer's registration");
    st.persist_slot = cfg.node->pool->acquire();
    if (!st.persist_slot)
      return caf::make_error(gpu::gpu_errc::budget_exceeded,
                             "no buffer slot left for persists");
    // The node's buffer is registered once (the first GPU with a device);
    // the other GPUs share that registration.
    const gpu::pinned_host* first = nullptr;
    for (uint32_t k = 0; k < cfg.gpus; ++k)
      if (auto& dev = cfg.devices[k]) {
        auto& lane = st.lanes[k];
        auto pinned =
            first ? dev->share_pinned(*first)
                  : dev->pin(cfg.node->pool->base(), cfg.node->pool->size());
        if (!pinned)
          return std::move(pinned.error());
        lane.pinned = std::move(*pinned);
        if (!first)
          first = &lane.pinned;
        auto s = dev->make_stream();
        if (!s)
          return std::move(s.error());
        lane.stream = std::move(*s);
        auto ev = dev->make_event();
        if (!ev)
          return std::move(ev.error());
        lane.done = std::move(*ev);
      }
  }
  return {};
}

impl_actor::behavior_type decode_engine(self_ptr self, engine_config cfg) {
  self->state.cfg = std::move(cfg);
  if (auto err = setup(self->state)) {
    self->quit(std::move(err));
    return impl_actor::behavior_type::make_empty_behavior();
  }
  // A prefill engine was lost (its node died; in a deployment the node agent
  // passes the notice on): what it had not finished sending never will be,
  // and the scheduler re-queues those requests under new ids.
  self->set_down_handler([self](const caf::down_msg& dm) {
    drop_requests(
        self,
        [&dm](const assignment& a) {
          return a.prefill_actor && a.prefill_actor.address() == dm.source;
        },
        caf::make_error(caf::sec::request_receiver_down,
                        "prefill engine lost"));
  });
  if (self->state.cfg.scheduler)
    schedule_report(self);
  return {
      [self](assign_atom, assignment& a) {
        auto& st = self->state;
        if (st.requests.count(a.request.id) == 0)
          place(self, a);
      },
      [self](admit_atom, assignment& a) -> caf::result<decode_slot> {
        auto& st = self->state;
        auto i = st.requests.find(a.request.id);
        de_request* r = i != st.requests.end() ? &i->second : &place(self, a);
        auto rp = self->make_response_promise<decode_slot>();
        r->admit_waiters.push_back(rp);
        if (r->phase == de_phase::waiting)
          reserve_rest(self, *r);
        else if (r->phase >= de_phase::receiving)
          answer_admits(*r);
        return rp;
      },
      [self](push_atom, layer_batch& b) -> caf::result<layer_batch> {
        return on_push(self, b);
      },
      [self](layer_atom, const layer_batch& b) { on_layer(self, b); },
      [self](prefilled_atom, const prefill_summary& s) { on_summary(self, s); },
      [self](release_atom, uint64_t id) {
        drop_requests(
            self, [id](const assignment& a) { return a.request.id == id; },
            caf::make_error(caf::sec::request_receiver_down,
                            "prefill engine gave up on request "
                                + std::to_string(id)));
      },
      [self](status_atom) { return group_load(self); },
      [self](pushed_atom, uint64_t tag, caf::error& err) {
        on_pushed(self, tag, std::move(err));
      },
      [self](prefill_end_atom, uint64_t id) { on_prefill_end(self, id); },
      [self](loaded_atom, uint64_t id) { on_loaded(self, id); },
      [self](on_gpu_atom, uint64_t id) { on_gpu(self, id); },
      [self](step_atom, uint64_t step) { on_step(self, step); },
      [self](kick_atom) {
        self->state.kicked = false;
        try_step(self);
      },
      [self](report_tick_atom) {
        auto& st = self->state;
        self->send(caf::actor_cast<scheduler_actor>(st.cfg.scheduler),
                   report_atom_v, group_load(self));
        schedule_report(self);
      },
  };
}

} // namespace

decode_engine_actor spawn_decode_engine(caf::actor_system& sys,
                                        engine_config cfg) {
  return caf::actor_cast<decode_engine_actor>(
      sys.spawn(decode_engine, std::move(cfg)));
}

} // namespace dualpath::actors
