#include "actors/engines/decode_engine.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/type_id.hpp>

#include "actors/bulk/bulk_post.hpp"
#include "actors/engines/engine_common.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/engines/range_allocator.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/kv_content.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, pushed_atom,
             "depushed")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, prefill_end_atom,
             "depfend")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, decode_end_atom,
             "dedecend")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, report_tick_atom,
             "detick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::decode_atoms, on_gpu_atom,
             "deongpu")

namespace dualpath::actors {

namespace {

using namespace dualpath::actors::decode_atoms;

namespace bulk = transport::bulk;
namespace storage = transport::storage;
using time_point = emulated_time::time_point;

struct de_request {
  assignment a;
  std::vector<block_hash> hashes;
  uint32_t tokens = 0;
  uint64_t slot_offset = 0;
  uint64_t slot_bytes = 0;
  bool has_slot = false;
  bool read_done = false;
  read_completion de_read;
  std::vector<caf::response_promise> load_waiters;
  uint32_t layers_ready = 0;
  time_point last_arrival{};
  bool summary_received = false;
  prefill_summary summary;
  bool finishing = false;
  gpu::device_buffer gpu;
  time_point decode_start{};
  uint32_t persists_left = 0;
  request_result result;
};

struct pending_push {
  caf::response_promise rp;
  layer_ready reply;
};

struct persist_job {
  uint64_t request_id = 0;
  block_hash hash = 0;
  block_hash parent = 0;
  uint32_t block = 0;
  bool from_gpu = false;
};

struct decode_state {
  engine_config cfg;
  gpu::host_memory memory; // pinned: whole pages of its own
  uint64_t size = 0;
  gpu::pinned_host pinned;
  gpu::stream stream;
  /// Recorded after a request's H2D copy and its Layer Block checksums; the
  /// device's notice (on_gpu message) says the prompt is in GPU memory.
  gpu::event gpu_done;
  /// Where the device writes a request's Layer Block checksums: room for
  /// the largest prompt the buffer holds, pinned once.
  gpu::host_memory sums; // sums_capacity values of uint64_t
  size_t sums_capacity = 0;
  gpu::pinned_host sums_pinned;
  /// The request whose KV is being copied to the GPU (one at a time, in
  /// gpu_wait order), and the checksums its Layer Blocks must have.
  std::optional<uint64_t> on_the_way;
  std::vector<uint64_t> expected_sums;
  bulk::local_registration registration;
  range_allocator slots;
  uint64_t persist_offset = 0; // one Full Block payload, reserved at start
  uint64_t payload_bytes = 0;
  std::unordered_map<uint64_t, de_request> requests;
  std::deque<std::pair<assignment, caf::response_promise>> admissions;
  /// Prompt tokens of `requests` and `admissions` (tok_e), kept as they
  /// change: a load report is O(1), not a walk over every request.
  uint64_t tok = 0;
  std::deque<uint64_t> gpu_wait;
  std::deque<persist_job> persists;
  bool persist_busy = false;
  std::unordered_map<uint64_t, pending_push> pushes;
  uint64_t next_tag = 1;
  static inline const char* name = "decode_engine";

  // Device work in flight writes `sums` and the requests' GPU memory, and
  // reads the slots: it completes before any of them goes.
  ~decode_state() {
    if (cfg.device && stream.valid())
      static_cast<void>(cfg.device->synchronize(stream));
  }
};

using self_ptr = caf::stateful_actor<decode_state>*;

// Whether the prompt's KV is verified where it lies once in GPU memory (the
// checksum kernel; the host backend's stream on its stand-in) instead of in
// the DRAM slot before.
bool verifies_on_device(const decode_state& st) {
  return st.cfg.verify_kv && st.cfg.device && st.cfg.real_bytes
         && st.sums_capacity > 0;
}

std::byte* slot_ptr(self_ptr self, const de_request& r) {
  return self->state.memory.get() + r.slot_offset;
}

time_point reserve(const link_ptr& link, uint64_t nominal, time_point now) {
  return link && nominal > 0 ? link->reserve(nominal, now) : now;
}

const link_ptr& rank_link(const std::vector<link_ptr>& links, uint32_t rank) {
  static const link_ptr none;
  return rank < links.size() ? links[rank] : none;
}

// The whole buffer as a region: its bulk registration, or (no bulk
// transport, e.g. Oracle-only setups) a local descriptor of the same memory.
remote_region buffer_region(const decode_state& st) {
  if (st.registration)
    return st.registration.describe();
  return remote_region{
      st.cfg.node ? st.cfg.node->name : std::string{}, 0, 0,
      reinterpret_cast<uint64_t>(st.memory.get()),     0, st.size};
}

void try_finish(self_ptr self, uint64_t id);
void try_admit(self_ptr self);
void try_gpu(self_ptr self);
void verify_in_slot(self_ptr self, de_request& r);
engine_load own_load(self_ptr self);

// seq_e, tok_e and free HBM change only where requests are admitted,
// placed on the GPU or removed, and each of those ends in try_admit() or
// try_gpu().
void publish(self_ptr self) {
  publish_load(self->state.cfg, own_load(self));
}

// Observation (null hooks: nothing): a span of request `id` on this engine's
// track ("gpu<rank>") or its compute NIC's ("cnic<rank>"), emulated ns.
void trace(self_ptr self, const char* track, const char* name, uint64_t id,
           int64_t begin_ns, int64_t end_ns, uint64_t nominal_bytes = 0,
           const char* direction = "", int32_t layer = -1) {
  span(self->state.cfg, track, name, id, layer, begin_ns, end_ns, nominal_bytes,
       direction);
}

void on_de_read(self_ptr self, uint64_t id, read_completion c) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  auto& cfg = st.cfg;
  lease_release done;
  done.lease_ids.reserve(c.leases.size());
  for (auto& l : c.leases)
    done.lease_ids.push_back(l.lease_id);
  if (i == st.requests.end()) {
    if (!done.lease_ids.empty())
      self->send(cfg.node->reader, release_atom_v, std::move(done));
    return;
  }
  auto& r = i->second;
  const auto bt = cfg.model.block_tokens;
  const uint64_t block_layer = uint64_t{bt} * bpt(cfg);
  for (auto& l : c.leases) {
    auto src = lease_payload(l, block_layer * cfg.model.layers);
    if (cfg.real_bytes && uint64_t{l.block_index + 1} * bt <= r.tokens)
      for (uint32_t layer = 0; layer < cfg.model.layers; ++layer)
        std::memcpy(
            slot_ptr(self, r)
                + slot_offset(layer, r.tokens, l.block_index * bt, bpt(cfg)),
            src + layer * block_layer, block_layer);
    r.result.bytes_read_de +=
        block_layer * cfg.model.layers / std::max<uint64_t>(bpt(cfg), 1)
        * cfg.model.nominal_bytes_per_token_layer * l.blocks;
  }
  // The blocks are in the request's slot now: one release for all.
  if (!done.lease_ids.empty())
    self->send(cfg.node->reader, release_atom_v, std::move(done));
  // What `load` answers: the outcome (the failed blocks) without the leases,
  // which are released now (~500 of them per agentic prompt, copied into
  // every answer before).
  c.leases = {};
  r.de_read = std::move(c);
  r.read_done = true;
  for (auto& rp : r.load_waiters)
    rp.deliver(r.de_read);
  r.load_waiters.clear();
  try_finish(self, id);
}

void start(self_ptr self, assignment a, caf::response_promise rp,
           uint64_t offset, uint64_t bytes) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto id = a.request.id;
  auto& r = st.requests[id];
  r.a = std::move(a);
  st.tok -= r.tokens; // 0 unless the id was here already
  r.tokens = static_cast<uint32_t>(r.a.request.tokens.size());
  st.tok += r.tokens;
  r.hashes = prompt_block_hashes(r.a.request.tokens, cfg.model.block_tokens);
  r.slot_offset = offset;
  r.slot_bytes = bytes;
  r.has_slot = true;
  r.result.id = id;
  r.result.prefill = r.a.prefill;
  r.result.decode = r.a.decode;
  auto region = buffer_region(st).subrange(offset, bytes);
  if (!region) {
    rp.deliver(std::move(region.error()));
    return;
  }
  rp.deliver(decode_slot{id, *region});
  auto& plan = r.a.plan;
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
        [self, id](read_completion c) { on_de_read(self, id, std::move(c)); });
  } else {
    r.read_done = true;
    r.de_read.request_id = id;
  }
}

void try_admit(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  while (!st.admissions.empty()) {
    auto& [a, rp] = st.admissions.front();
    uint64_t bytes =
        uint64_t{cfg.model.layers} * a.request.tokens.size() * bpt(cfg);
    if (bytes == 0 || bytes > st.slots.capacity()) {
      rp.deliver(
          caf::make_error(gpu::gpu_errc::budget_exceeded,
                          "prompt KV of " + std::to_string(bytes)
                              + " bytes does not fit the decode buffer"));
      st.tok -= a.request.tokens.size();
      st.admissions.pop_front();
      continue;
    }
    auto off = st.slots.allocate(bytes);
    if (!off)
      break; // wait for a slot to be freed
    auto item = std::move(st.admissions.front());
    st.admissions.pop_front();
    st.tok -= item.first.request.tokens.size();
    start(self, std::move(item.first), std::move(item.second), *off, bytes);
  }
  publish(self);
}

void try_finish(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  if (r.finishing || !r.read_done || !r.summary_received
      || r.layers_ready < st.cfg.model.layers)
    return;
  r.finishing = true;
  auto now = emulated_now(self, st.cfg.time);
  self->delayed_send(self, st.cfg.time.to_actor(r.last_arrival - now),
                     prefill_end_atom_v, id);
}

void on_prefill_end(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  auto now = emulated_now(self, cfg.time);
  r.result.ttft_ns = since_start(cfg.time, now) - r.a.request.arrival_ns;
  if (cfg.verify_kv) {
    if (!moves_bytes(cfg))
      for (uint32_t l = 0; l < cfg.model.layers; ++l)
        fill_tokens(r.hashes, cfg.model.block_tokens, l, 0, r.tokens, bpt(cfg),
                    slot_ptr(self, r) + slot_offset(l, r.tokens, 0, bpt(cfg)));
    if (!verifies_on_device(st))
      verify_in_slot(self, r);
  }
  st.gpu_wait.push_back(id);
  try_gpu(self);
}

// Verifies the prompt KV byte for byte in its DRAM slot.
void verify_in_slot(self_ptr self, de_request& r) {
  auto& cfg = self->state.cfg;
  auto check = check_slot(r.hashes, cfg.model.block_tokens, cfg.model.layers,
                          r.tokens, bpt(cfg), slot_ptr(self, r));
  r.result.blocks_verified = check.blocks_ok;
  r.result.verify_failures += check.blocks_failed;
}

void start_decode(self_ptr self, de_request& r) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto now = emulated_now(self, cfg.time);
  auto t = now;
  if (moves_bytes(cfg)) {
    uint64_t nominal = uint64_t{r.tokens} * cfg.model.layers
                       * cfg.model.nominal_bytes_per_token_layer;
    auto& link = rank_link(cfg.node->cnic_rx, cfg.id.rank);
    auto rx = reserve(link, nominal, now);
    t = std::max({t, reserve(cfg.node->dram, nominal, now), rx});
    if (link && link->rate() > 0) {
      // The NIC's window for these bytes (windows of one link never
      // overlap; the duration is rounded down).
      auto busy = std::chrono::nanoseconds(
          static_cast<int64_t>(static_cast<double>(nominal) * 1e9
                               / static_cast<double>(link->rate())));
      trace(self, "cnic", "h2d", r.a.request.id,
            since_start(cfg.time, std::max(now, rx - busy)),
            since_start(cfg.time, rx), nominal, " rx");
    }
  }
  // The DRAM slot is free once the KV is in GPU memory.
  st.slots.free(r.slot_offset);
  r.has_slot = false;
  try_admit(self);
  uint32_t gen = r.a.request.gen_tokens;
  uint32_t steps = gen > 0 ? gen - 1 : 0;
  double tpot_s = decode_tpot_seconds(cfg, r.tokens + gen / 2);
  auto tpot = gpu::to_duration(tpot_s);
  r.result.tpot_ns = steps > 0 ? tpot.count() : 0;
  if (steps > 0)
    r.result.ttst_ns = since_start(cfg.time, t + tpot) - r.a.request.arrival_ns;
  auto end = t + tpot * steps;
  r.result.done_ns = since_start(cfg.time, end);
  trace(self, "gpu", "generate", r.a.request.id, since_start(cfg.time, t),
        r.result.done_ns);
  self->delayed_send(self, cfg.time.to_actor(end - now), decode_end_atom_v,
                     r.a.request.id);
}

// Compares the Layer Block checksums the device computed for request r
// with the ones its content must have.
void verify_on_device(self_ptr self, de_request& r) {
  auto& st = self->state;
  auto check = check_slot_checksums(st.expected_sums,
                                    reinterpret_cast<uint64_t*>(st.sums.get()),
                                    st.cfg.model.layers, r.hashes.size());
  r.result.blocks_verified = check.blocks_ok;
  r.result.verify_failures += check.blocks_failed;
}

// Submits request r's prompt KV slot -> GPU memory and, when verifying, its
// Layer Block checksums on the device, then the event whose notice
// (on_gpu) finishes the request's admission to the GPU. False when nothing
// is in flight: r may decode now (the device refused, the failure counted,
// or, under simulated time, the work was waited for in place).
bool submit_to_gpu(self_ptr self, de_request& r) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto& dev = *cfg.device;
  auto err = dev.copy_h2d(st.pinned, r.gpu,
                          {gpu::copy_chunk{r.slot_offset, 0, r.slot_bytes}},
                          st.stream);
  const bool verify = verifies_on_device(st);
  auto grid =
      slot_grid(cfg.model.block_tokens, cfg.model.layers, r.tokens, bpt(cfg));
  if (!err && verify)
    err = dev.enqueue_checksums(r.gpu, grid, st.sums_pinned, 0, st.stream);
  if (!err)
    err = dev.record(st.gpu_done, st.stream);
  const bool in_place = waits_for_device_in_place(self->home_system());
  if (!err && !in_place) {
    auto hdl = caf::actor_cast<caf::actor>(self);
    err = dev.notify(st.gpu_done, st.stream, [hdl, id = r.a.request.id] {
      caf::anon_send(hdl, on_gpu_atom_v, id);
    });
  }
  if (!err && in_place)
    err = dev.synchronize(st.gpu_done);
  if (err) {
    // Nothing (more) completes for this request: wait for what was
    // submitted, then verify where the bytes still are.
    static_cast<void>(dev.synchronize(st.stream));
    r.result.verify_failures += 1;
    if (verify)
      verify_in_slot(self, r);
    return false;
  }
  // The expected checksums, computed while the device works.
  if (verify)
    st.expected_sums = slot_checksums(r.hashes, cfg.model.block_tokens,
                                      cfg.model.layers, r.tokens, bpt(cfg));
  if (in_place) {
    if (verify)
      verify_on_device(self, r);
    return false;
  }
  st.on_the_way = r.a.request.id;
  return true;
}

// Request `id`'s KV is in GPU memory (and its checksums in `sums`).
void on_gpu(self_ptr self, uint64_t id) {
  auto& st = self->state;
  if (st.on_the_way != id)
    return;
  st.on_the_way.reset();
  auto i = st.requests.find(id);
  if (i != st.requests.end()) {
    if (verifies_on_device(st))
      verify_on_device(self, i->second);
    start_decode(self, i->second);
  }
  try_gpu(self);
}

void try_gpu(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  while (!st.gpu_wait.empty() && !st.on_the_way) {
    auto id = st.gpu_wait.front();
    auto i = st.requests.find(id);
    if (i == st.requests.end()) {
      st.gpu_wait.pop_front();
      continue;
    }
    auto& r = i->second;
    if (cfg.device) {
      auto buf = cfg.device->allocate(r.slot_bytes);
      if (!buf) {
        if (buf.error() == gpu::gpu_errc::budget_exceeded
            && cfg.device->bytes_allocated() > 0)
          break; // wait for another request's GPU memory
        // Cannot ever fit: decode without the copy, counting it as failed.
        r.result.verify_failures += 1;
        if (verifies_on_device(st))
          verify_in_slot(self, r);
      } else {
        r.gpu = std::move(*buf);
        if (cfg.real_bytes && submit_to_gpu(self, r)) {
          st.gpu_wait.pop_front();
          break; // on_gpu goes on
        }
      }
    }
    st.gpu_wait.pop_front();
    start_decode(self, r);
  }
  publish(self);
}

void send_done(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  r.result.bytes_read_pe = r.summary.bytes_read_pe;
  r.result.recomputed_blocks = r.summary.recomputed_blocks;
  r.result.bytes_compute_net =
      r.result.bytes_pe_to_de + r.result.bytes_de_to_pe;
  auto result = r.result;
  if (st.cfg.hooks && st.cfg.hooks->tracing()) {
    auto now = since_start(st.cfg.time, emulated_now(self, st.cfg.time));
    if (result.blocks_persisted > 0)
      trace(self, "gpu", "persist", id, result.done_ns, now);
    trace(self, "gpu", "decode", id, r.a.request.arrival_ns + result.ttft_ns,
          now);
  }
  if (r.has_slot)
    st.slots.free(r.slot_offset);
  st.tok -= r.tokens;
  st.requests.erase(i);
  if (st.cfg.scheduler)
    self->send(caf::actor_cast<scheduler_actor>(st.cfg.scheduler), done_atom_v,
               std::move(result));
  try_admit(self);
  try_gpu(self);
}

void pump_persist(self_ptr self);

// The modeled data plane's persist: the chain of blocks at the queue's front
// of one request as one persist_batch (generated content, nothing to copy),
// so a request's ~7 persists cost 3 messages instead of 3 each.
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
  auto n = batch.hashes.size();
  st.persist_busy = true;
  auto done = [self, id, n](uint32_t written) {
    auto& st = self->state;
    st.persist_busy = false;
    for (size_t k = 0; k < n && !st.persists.empty(); ++k)
      st.persists.pop_front();
    auto i = st.requests.find(id);
    if (i != st.requests.end()) {
      auto& r = i->second;
      r.result.blocks_persisted += std::min<uint32_t>(written, n);
      r.persists_left -= std::min<uint32_t>(r.persists_left, n);
      if (r.persists_left == 0)
        send_done(self, id);
    }
    pump_persist(self);
  };
  if (!cfg.node->reader) {
    done(0);
    return;
  }
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
  const uint64_t block_layer = uint64_t{bt} * bpt(cfg);
  std::byte* dst = st.memory.get() + st.persist_offset;
  bool copied = false;
  if (job.from_gpu && r.gpu.valid()) {
    // GPU -> host DRAM: the block's Layer Blocks out of the layer-major KV.
    std::vector<gpu::copy_chunk> chunks;
    for (uint32_t l = 0; l < cfg.model.layers; ++l)
      chunks.push_back(
          gpu::copy_chunk{slot_offset(l, r.tokens, job.block * bt, bpt(cfg)),
                          st.persist_offset + l * block_layer, block_layer});
    auto err = cfg.device->copy_d2h(r.gpu, st.pinned, chunks, st.stream);
    if (!err)
      err = cfg.device->synchronize(st.stream);
    copied = !err;
  }
  if (!copied)
    for (uint32_t l = 0; l < cfg.model.layers; ++l)
      storage::kv_fill_layer(job.hash, l, bt, bpt(cfg), dst + l * block_layer);
  auto source = buffer_region(st).subrange(st.persist_offset, st.payload_bytes);
  st.persist_busy = true;
  auto done = [self, job](bool ok) {
    auto& st = self->state;
    st.persist_busy = false;
    if (!st.persists.empty())
      st.persists.pop_front();
    auto i = st.requests.find(job.request_id);
    if (i != st.requests.end()) {
      if (ok)
        ++i->second.result.blocks_persisted;
      if (--i->second.persists_left == 0)
        send_done(self, job.request_id);
    }
    pump_persist(self);
  };
  if (!source || !cfg.node->reader) {
    done(false);
    return;
  }
  self->request(cfg.node->reader, caf::infinite, persist_atom_v,
                persist_request{job.hash, job.parent, bt, *source})
      .then([done](block_hash) { done(true); },
            [done](caf::error&) { done(false); });
}

void on_decode_end(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto& r = i->second;
  const auto bt = cfg.model.block_tokens;
  auto& prompt = r.a.request.tokens;
  auto& output = r.a.request.output_tokens;
  if (!moves_bytes(cfg)) {
    std::vector<uint32_t> seq = prompt.to_vector();
    seq.insert(seq.end(), output.begin(), output.end());
    // Oracle bypasses I/O, not caching: the blocks the other modes persist
    // are stored at once, without time, so the agent's next turn finds the
    // same hits (without them every later turn recomputed its history).
    // A failed write leaves the blocks uncounted in blocks_persisted, as a
    // failed persist does in the other modes.
    if (cfg.node && cfg.node->store)
      if (auto stats = storage::populate(*cfg.node->store, {seq}))
        r.result.blocks_persisted += static_cast<uint32_t>(stats->written);
    send_done(self, id);
    return;
  }
  // The full blocks of prompt + output from the first one not read from
  // storage: the prompt's own were hashed at admission (r.hashes); only the
  // blocks from the prompt's partial tail on are hashed here (hashing and
  // copying the whole sequence again took ~10% of a simulation).
  uint32_t prompt_full = r.tokens / bt;
  uint64_t total = r.tokens + output.size();
  uint64_t blocks = bt > 0 ? total / bt : 0;
  // Token k of prompt + output, without building the sequence.
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
    job.request_id = id;
    job.hash = h;
    job.parent = parent;
    job.block = static_cast<uint32_t>(b);
    job.from_gpu = b < prompt_full;
    st.persists.push_back(job);
    ++r.persists_left;
    parent = h;
  }
  if (r.persists_left == 0) {
    send_done(self, id);
    return;
  }
  pump_persist(self);
}

engine_load own_load(self_ptr self) {
  auto& st = self->state;
  auto x = own_load_of(
      st.cfg, static_cast<uint32_t>(st.requests.size() + st.admissions.size()),
      st.tok);
#ifndef NDEBUG
  uint64_t walked = 0;
  for (auto& kv : st.requests)
    walked += kv.second.tokens;
  for (auto& a : st.admissions)
    walked += a.first.request.tokens.size();
  assert(walked == st.tok);
#endif
  return x;
}

caf::result<engine_load> status(self_ptr self) {
  return load_with_read_queue(self, [self] { return own_load(self); });
}

void schedule_report(self_ptr self) {
  auto& cfg = self->state.cfg;
  self->delayed_send(
      self, cfg.time.to_actor(std::chrono::nanoseconds(cfg.fetch_period_ns)),
      report_tick_atom_v);
}

// Decode group leader: report the group's loads to the scheduler.
void report(self_ptr self) {
  auto& cfg = self->state.cfg;
  auto g = std::make_shared<group_report>();
  g->group = cfg.group;
  g->role = engine_role::decode;
  g->engines.push_back(own_load(self));
  auto board = cfg.node ? cfg.node->loads : nullptr;
  if (board) {
    // Every load as last published (no messages); the read queue too.
    auto q = board->read_queue();
    g->engines.front().read_q_tokens = q.tokens;
    g->engines.front().read_q_bytes = q.bytes;
    auto others = board->others(cfg.id.rank);
    g->engines.insert(g->engines.end(), others.begin(), others.end());
    self->send(caf::actor_cast<scheduler_actor>(cfg.scheduler), report_atom_v,
               std::move(*g));
    schedule_report(self);
    return;
  }
  auto me = caf::actor_cast<caf::actor>(self);
  auto left = std::make_shared<size_t>(0);
  std::vector<caf::actor> members;
  for (auto& m : cfg.group_members)
    if (m && m != me)
      members.push_back(m);
  *left = members.size();
  auto done = [self, g] {
    self->send(caf::actor_cast<scheduler_actor>(self->state.cfg.scheduler),
               report_atom_v, std::move(*g));
    schedule_report(self);
  };
  if (members.empty()) {
    done();
    return;
  }
  for (auto& m : members)
    self->request(m, caf::infinite, status_atom_v)
        .then(
            [g, left, done](engine_load& x) {
              g->engines.push_back(std::move(x));
              if (--*left == 0)
                done();
            },
            [left, done](caf::error&) {
              if (--*left == 0)
                done();
            });
}

// A push's bulk batch completed: answer the prefill engine's push request.
void on_pushed(self_ptr self, uint64_t tag, caf::error error) {
  auto& st = self->state;
  auto i = st.pushes.find(tag);
  if (i == st.pushes.end())
    return;
  if (!error)
    i->second.rp.deliver(i->second.reply);
  else
    i->second.rp.deliver(std::move(error)); // the transport's own error
  st.pushes.erase(i);
}

// Drops the admissions and unfinished requests `which` selects (their
// prefill engine is gone or gave up on them): waiters get `why`, slots are
// freed. A decode-side read still in flight finds no request and releases
// its leases (on_de_read).
template <class Predicate>
void drop_requests(self_ptr self, Predicate which, const caf::error& why) {
  auto& st = self->state;
  for (auto i = st.admissions.begin(); i != st.admissions.end();) {
    if (which(i->first)) {
      i->second.deliver(why);
      st.tok -= i->first.request.tokens.size();
      i = st.admissions.erase(i);
    } else {
      ++i;
    }
  }
  std::vector<uint64_t> dropped;
  for (auto& [id, r] : st.requests)
    if (!r.finishing && which(r.a))
      dropped.push_back(id);
  for (auto id : dropped) {
    auto i = st.requests.find(id);
    for (auto& rp : i->second.load_waiters)
      rp.deliver(why);
    if (i->second.has_slot)
      st.slots.free(i->second.slot_offset);
    st.tok -= i->second.tokens;
    st.requests.erase(i);
  }
  try_admit(self);
}

caf::error setup(decode_state& st) {
  auto& cfg = st.cfg;
  st.payload_bytes =
      uint64_t{cfg.model.block_tokens} * cfg.model.layers * bpt(cfg);
  st.size = real_bytes(cfg.dram_buffer_bytes, cfg.byte_scale);
  if (st.size <= st.payload_bytes)
    return caf::make_error(gpu::gpu_errc::budget_exceeded,
                           "decode buffer smaller than one Full Block");
  // Not value-initialised: pages are touched only when KV lands there.
  st.memory = gpu::allocate_host_memory(st.size);
  if (!st.memory)
    return caf::make_error(gpu::gpu_errc::out_of_memory,
                           "decode buffer of " + std::to_string(st.size)
                               + " B: no host memory");
  if (cfg.device) {
    auto pinned = cfg.device->pin(st.memory.get(), st.size);
    if (!pinned)
      return std::move(pinned.error());
    st.pinned = std::move(*pinned);
    auto s = cfg.device->make_stream();
    if (!s)
      return std::move(s.error());
    st.stream = std::move(*s);
    auto ev = cfg.device->make_event();
    if (!ev)
      return std::move(ev.error());
    st.gpu_done = std::move(*ev);
  }
  if (cfg.node && cfg.node->bulk) {
    auto reg = cfg.node->bulk->register_region(st.memory.get(), st.size);
    if (!reg)
      return std::move(reg.error());
    st.registration = std::move(*reg);
  }
  // The persist staging sits at the end; the rest holds slots.
  st.persist_offset = st.size - st.payload_bytes;
  st.slots = range_allocator{st.persist_offset};
  // Checksums of the largest prompt the slots hold, one per Layer Block.
  if (cfg.device && cfg.real_bytes && cfg.verify_kv && cfg.model.layers > 0
      && bpt(cfg) > 0 && cfg.model.block_tokens > 0) {
    auto max_tokens =
        st.persist_offset / (uint64_t{cfg.model.layers} * bpt(cfg));
    auto blocks =
        (max_tokens + cfg.model.block_tokens - 1) / cfg.model.block_tokens;
    st.sums_capacity = std::max<uint64_t>(1, blocks * cfg.model.layers);
    st.sums = gpu::allocate_host_memory(st.sums_capacity * sizeof(uint64_t));
    if (!st.sums)
      return caf::make_error(gpu::gpu_errc::out_of_memory,
                             "checksum results: no host memory");
    auto pinned =
        cfg.device->pin(st.sums.get(), st.sums_capacity * sizeof(uint64_t));
    if (!pinned)
      return std::move(pinned.error());
    st.sums_pinned = std::move(*pinned);
  }
  return caf::none;
}

caf::behavior decode_engine(self_ptr self, engine_config cfg) {
  self->state.cfg = std::move(cfg);
  if (auto err = setup(self->state)) {
    self->quit(std::move(err));
    return {};
  }
  // A prefill engine was lost (its node died; in a deployment the node agent
  // passes the notice on): what it had not finished sending never will be,
  // and the scheduler re-queues those requests under new ids, so their
  // admissions and slots are dropped here.
  self->set_down_handler([self](const caf::down_msg& dm) {
    drop_requests(
        self,
        [&dm](const assignment& a) {
          return a.prefill_actor && a.prefill_actor.address() == dm.source;
        },
        caf::make_error(caf::sec::request_receiver_down,
                        "prefill engine lost"));
  });
  auto& c = self->state.cfg;
  if (leads_group(c))
    schedule_report(self);
  publish(self);
  return {
      [self](admit_atom, assignment& a) -> caf::result<decode_slot> {
        auto& st = self->state;
        if (st.requests.count(a.request.id))
          return caf::make_error(caf::sec::invalid_argument,
                                 "request already admitted");
        auto rp = self->make_response_promise<decode_slot>();
        st.tok += a.request.tokens.size();
        st.admissions.emplace_back(std::move(a), rp);
        try_admit(self);
        return rp;
      },
      [self](layer_atom, const layer_ready& x) {
        auto& st = self->state;
        auto i = st.requests.find(x.request_id);
        if (i == st.requests.end())
          return;
        auto& r = i->second;
        auto now = emulated_now(self, st.cfg.time);
        auto t = std::max(now, from_ns(st.cfg.time, x.done_ns));
        auto nominal = nominal_of_real(x.bytes, st.cfg.model);
        if (nominal > 0) {
          auto& link = rank_link(st.cfg.node->cnic_rx, st.cfg.id.rank);
          auto rx = reserve(link, nominal, now);
          t = std::max({t, reserve(st.cfg.node->dram, nominal, now), rx});
          r.result.bytes_pe_to_de += nominal;
          if (link && link->rate() > 0) {
            // The layer's arrival: this NIC's window for its bytes, the
            // end of the flow from the prefill engine's send (timeline).
            auto busy = std::chrono::nanoseconds(
                static_cast<int64_t>(static_cast<double>(nominal) * 1e9
                                     / static_cast<double>(link->rate())));
            trace(self, "cnic", "receive", x.request_id,
                  since_start(st.cfg.time, std::max(now, rx - busy)),
                  since_start(st.cfg.time, rx), nominal, " rx",
                  static_cast<int32_t>(x.layer));
          }
        }
        r.last_arrival = std::max(r.last_arrival, t);
        ++r.layers_ready;
        try_finish(self, x.request_id);
      },
      [self](load_atom, uint64_t id) -> caf::result<read_completion> {
        auto& st = self->state;
        auto i = st.requests.find(id);
        if (i == st.requests.end())
          return caf::make_error(caf::sec::invalid_argument,
                                 "load: request not admitted here");
        if (i->second.read_done)
          return i->second.de_read;
        auto rp = self->make_response_promise<read_completion>();
        i->second.load_waiters.push_back(rp);
        return rp;
      },
      [self](push_atom, const layer_push& p) -> caf::result<layer_ready> {
        auto& st = self->state;
        auto& cfg = st.cfg;
        auto i = st.requests.find(p.request_id);
        if (i == st.requests.end() || !i->second.has_slot)
          return caf::make_error(caf::sec::invalid_argument,
                                 "push: request has no slot here");
        auto& r = i->second;
        uint64_t len = uint64_t{p.tokens} * bpt(cfg);
        if (p.layer >= cfg.model.layers || p.first_token + p.tokens > r.tokens
            || p.destination.length != len || len == 0)
          return caf::make_error(caf::sec::invalid_argument,
                                 "push: range outside the request's slot");
        auto now = emulated_now(self, cfg.time);
        uint64_t nominal =
            uint64_t{p.tokens} * cfg.model.nominal_bytes_per_token_layer;
        auto t = std::max(
            {now, reserve(cfg.node->dram, nominal, now),
             reserve(rank_link(cfg.node->cnic_tx, cfg.id.rank), nominal, now)});
        r.result.bytes_de_to_pe += nominal;
        auto tag = st.next_tag++;
        auto rp = self->make_response_promise<layer_ready>();
        st.pushes.emplace(
            tag, pending_push{rp, layer_ready{p.request_id, p.layer, len,
                                              since_start(cfg.time, t)}});
        bulk::batch b;
        b.tclass = transport::traffic_class::kv;
        b.tag = tag;
        b.writes.push_back(bulk::write_request{
            &st.registration,
            r.slot_offset
                + slot_offset(p.layer, r.tokens, p.first_token, bpt(cfg)),
            p.destination});
        auto hdl = caf::actor_cast<caf::actor>(self);
        auto early = post_or_complete(
            *cfg.node->bulk, std::move(b), [hdl, tag](bulk::completion c) {
              caf::anon_send(hdl, pushed_atom_v, tag, std::move(c.error));
            });
        if (early)
          on_pushed(self, tag, std::move(early->error));
        return rp;
      },
      [self](pushed_atom, uint64_t tag, caf::error& error) {
        on_pushed(self, tag, std::move(error));
      },
      [self](prefilled_atom, const prefill_summary& s) {
        auto& st = self->state;
        auto i = st.requests.find(s.request_id);
        if (i == st.requests.end())
          return;
        i->second.summary = s;
        i->second.summary_received = true;
        try_finish(self, s.request_id);
      },
      [self](prefill_end_atom, uint64_t id) { on_prefill_end(self, id); },
      [self](decode_end_atom, uint64_t id) { on_decode_end(self, id); },
      [self](report_tick_atom) { report(self); },
      [self](on_gpu_atom, uint64_t id) { on_gpu(self, id); },
      [self](release_atom, uint64_t id) {
        drop_requests(
            self, [id](const assignment& a) { return a.request.id == id; },
            caf::make_error(caf::sec::request_receiver_down,
                            "prefill engine gave up on request "
                                + std::to_string(id)));
      },
      [self](status_atom) { return status(self); },
  };
}

} // namespace

decode_engine_actor spawn_decode_engine(caf::actor_system& sys,
                                        engine_config cfg) {
  return caf::actor_cast<decode_engine_actor>(
      sys.spawn(decode_engine, std::move(cfg)));
}

} // namespace dualpath::actors
