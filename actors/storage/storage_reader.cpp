#include "actors/storage/storage_reader.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/worker_pool.hpp"

namespace dualpath::actors {

using transport::storage::block_store;
using transport::storage::buffer_pool;
using transport::storage::storage_errc;

namespace {

// The reader's full interface: the public one plus the completion message
// its I/O workers (and its delayed pacing messages) send to it.
// Internal messages: (done, job id) a job finished; (done) a waiting
// reservation's timeout passed.
using reader_impl =
    storage_reader_actor::extend<caf::reacts_to<done_atom, uint64_t>,
                                 caf::reacts_to<done_atom>>;

// One block read or one persisted block. The worker fills `err` and sets
// nothing else; the actor reads it only after the done message arrived
// (the mailbox orders the accesses).
struct io_job {
  enum kind_t { read, write, write_batch } kind = read;
  uint64_t request = 0; // pending_read id (reads)
  size_t index = 0;     // block position in the request (reads)
  block_hash hash = 0;
  uint32_t slot = 0;                       // pool slot (reads)
  caf::actor_clock::time_point ready_at{}; // pacing: not before this
  bool io_done = false; // set by the actor on the first done message
  caf::error err;
  caf::typed_response_promise<block_hash> write_promise; // (writes)
  // A persist_batch (write_batch): its blocks, how many were written, and
  // the reply.
  persist_batch batch;
  uint32_t written = 0;
  caf::typed_response_promise<uint32_t> batch_promise;
  // A modeled read of several blocks of one request (modeled_reads without
  // I/O threads): every block below, completed by one paced message at the
  // last block's time; index/hash/slot/err above are unused then.
  struct part {
    size_t index = 0;
    block_hash hash = 0;
    uint32_t slot = 0;
    caf::error err;
  };
  std::vector<part> parts;
};

struct pending_read {
  read_request req;
  caf::typed_response_promise<read_completion> promise;
  size_t next = 0;     // next block to issue
  size_t finished = 0; // blocks done (leased or failed)
  std::vector<std::optional<buffer_lease>> leases; // per block (not runs)
  std::vector<caf::error> errors; // per block (not runs): why it failed
  // With lease_runs: one lease per run of blocks, and the failed blocks
  // with why each failed.
  std::vector<buffer_lease> runs;
  std::vector<block_hash> failed;
  std::vector<caf::error> why_failed;
  caf::actor_clock::time_point accepted_at{}; // for the timeline
  bool waited = false; // a block found the buffer full (or reserved ahead)
};

struct reader_state;
bool release(reader_state& st, uint64_t lease_id);

struct reader_state {
  storage_reader_config cfg;
  std::unique_ptr<transport::storage::worker_pool>
      workers;               // joined first on destruction
  std::deque<uint64_t> fifo; // requests with blocks left to issue
  std::unordered_map<uint64_t, pending_read> reads;
  std::unordered_map<uint64_t, std::shared_ptr<io_job>> jobs;
  // Leases by pool slot: a lease id is (generation << 32) | slot, so
  // finding and checking one needs no map. A slot's generation grows with
  // every lease of it (from 1), which makes ids unique per slot and a stale
  // or repeated release a mismatch; `leased` marks the slots leased now.
  std::vector<uint32_t> lease_gen;
  std::vector<uint8_t> leased; // 0: free, 1: a read's, 2: a reservation's
  size_t leases = 0;           // slots leased now
  uint32_t read_held = 0;      // slots (places) held by reads: <= read_cap
  // Reservations waiting for room (served before any queued read).
  struct waiting_reserve {
    reserve_request req;
    caf::typed_response_promise<read_completion> rp;
    bool waited = false; // found too little room when it arrived
    // When the requester stops waiting (reserve_request::timeout_ns), if
    // it set a limit.
    std::optional<caf::actor_clock::time_point> expires;
  };
  std::deque<waiting_reserve> reserves;
  // lease_runs: the places (slots) taken from the pool's capacity by
  // modeled reads, and the run leases (id -> blocks). A run lease id has
  // the top bit set; a reader with lease_runs hands out no slot leases, so
  // release() tells them apart by the config, not by the bit.
  uint32_t run_places = 0;
  struct run_places_of {
    uint32_t blocks = 0;
    bool read = true; // a read's run (else a reservation's)
  };
  std::unordered_map<uint64_t, run_places_of> runs;
  uint64_t next_run = 1;
  std::vector<uint8_t> present; // pump_modeled's scratch
  uint64_t next_id = 1;
  uint32_t inflight = 0;
  read_queue_status queue;
  // Holders (read_request::holder): the leases each holds, and how many of
  // its reads and reservations are still under way. A holder is monitored
  // from its first request; when it goes down its leases are freed, and its
  // record stays (marked down) until the last of its requests ends, whose
  // leases are freed then instead of recorded.
  struct holder_record {
    std::unordered_set<uint64_t> leases;
    uint32_t pending = 0;
    bool down = false;
  };
  std::unordered_map<caf::actor_addr, holder_record> holders;
  std::unordered_map<uint64_t, caf::actor_addr> holder_of; // lease -> holder
  static inline const char* name = "storage_reader";

  ~reader_state() {
    // Workers may still touch the pool/store of queued jobs: join them
    // before the members they use go away.
    workers.reset();
  }
};

using self_ptr = reader_impl::stateful_pointer<reader_state>;

// Runs `work` on a worker (or inline) and sends (done, id) to the reader
// afterwards, not before `ready_at` when it runs inline (the done handler
// would only put it off until then: one message per block less in a
// simulation). The worker holds only a weak handle, so a terminated reader
// does not linger because of queued jobs.
void dispatch(self_ptr self, uint64_t id, std::function<void()> work,
              caf::actor_clock::time_point ready_at) {
  auto& st = self->state;
  if (!st.workers) {
    work();
    auto now = self->clock().now();
    if (now < ready_at)
      self->delayed_send(self, ready_at - now, done_atom_v, id);
    else
      self->send(self, done_atom_v, id);
    return;
  }
  caf::weak_actor_ptr weak = caf::actor_cast<caf::weak_actor_ptr>(self);
  st.workers->post([weak, id, work = std::move(work)] {
    work();
    if (auto strong = weak.lock())
      caf::anon_send(caf::actor_cast<caf::actor>(strong), done_atom_v, id);
  });
}

uint64_t payload_bytes(const reader_state& st) {
  return st.cfg.store->geometry().payload_bytes();
}

// Observation (null hooks: nothing): the pool's leased bytes as a gauge.
void observe_buffer(const reader_state& st) {
  if (auto& h = st.cfg.hooks)
    h->gauge("dualpath_reader_buffer_used_bytes", {{"node", st.cfg.node}},
             static_cast<double>(st.leases * st.cfg.pool->slot_bytes()));
}

// The read queue changed: tell the node's load board and the hooks.
void observe_queue(const reader_state& st) {
  if (st.cfg.on_queue)
    st.cfg.on_queue(st.queue);
  if (auto& h = st.cfg.hooks) {
    observe::label_set node{{"node", st.cfg.node}};
    h->gauge("dualpath_read_queue_tokens", node,
             static_cast<double>(st.queue.tokens));
    h->gauge("dualpath_read_queue_bytes", node,
             static_cast<double>(st.queue.bytes));
  }
}

caf::actor_clock::time_point paced(reader_state& st, uint64_t bytes,
                                   caf::actor_clock::time_point now) {
  return st.cfg.pace ? st.cfg.pace(bytes, now) : now;
}

bool by_block_index(const buffer_lease& x, const buffer_lease& y) {
  return x.block_index < y.block_index;
}

constexpr uint64_t run_lease_bit = uint64_t{1} << 63;

// Slots reads may hold.
uint32_t read_cap(const reader_state& st) {
  auto slots = st.cfg.pool->slots();
  return st.cfg.read_cap == 0 ? slots : std::min(st.cfg.read_cap, slots);
}

// A pool place for one block: a slot, or with lease_runs a place counted
// against the pool's capacity (slot 0, unused). Reads stay within their cap.
std::optional<uint32_t> acquire_place(reader_state& st, bool for_read) {
  if (for_read && st.read_held >= read_cap(st))
    return std::nullopt;
  std::optional<uint32_t> slot;
  if (!st.cfg.lease_runs) {
    slot = st.cfg.pool->acquire();
  } else if (st.run_places < st.cfg.pool->slots()) {
    ++st.run_places;
    slot = 0;
  }
  if (slot && for_read)
    ++st.read_held;
  return slot;
}

// A place of a read given back (a failed block, a released lease).
void drop_read_place(reader_state& st) {
  st.read_held -= std::min<uint32_t>(st.read_held, 1);
}

// -- holders (read_request::holder) -------------------------------------------

// A read or reservation of `holder` (if any) begins: the holder is monitored
// from its first one.
void holder_begins(self_ptr self, const caf::actor& holder) {
  if (!holder)
    return;
  auto [i, fresh] = self->state.holders.try_emplace(holder.address());
  if (fresh)
    self->monitor(holder);
  ++i->second.pending;
}

// A read or reservation of `holder` (if any) ends with `leases` (none if it
// failed or was dropped): they become the holder's, or are freed at once if
// it went down meanwhile. True if that freed slots (the caller pumps).
bool holder_ends(reader_state& st, const caf::actor& holder,
                 const std::vector<buffer_lease>& leases) {
  if (!holder)
    return false;
  auto i = st.holders.find(holder.address());
  if (i == st.holders.end())
    return false;
  auto& h = i->second;
  h.pending -= std::min<uint32_t>(h.pending, 1);
  if (!h.down) {
    for (auto& l : leases) {
      h.leases.insert(l.lease_id);
      st.holder_of.emplace(l.lease_id, i->first);
    }
    return false;
  }
  bool freed = false;
  for (auto& l : leases)
    freed = release(st, l.lease_id) || freed;
  if (auto& hooks = st.cfg.hooks; hooks && !leases.empty())
    hooks->count("dualpath_reader_leases_reclaimed_total",
                 {{"node", st.cfg.node}}, static_cast<double>(leases.size()));
  if (h.pending == 0)
    st.holders.erase(i);
  return freed;
}

// A released lease is no longer its holder's.
void forget_holder(reader_state& st, uint64_t lease_id) {
  auto i = st.holder_of.find(lease_id);
  if (i == st.holder_of.end())
    return;
  if (auto h = st.holders.find(i->second); h != st.holders.end())
    h->second.leases.erase(lease_id);
  st.holder_of.erase(i);
}

void finish_read(self_ptr self, uint64_t request) {
  auto& st = self->state;
  auto i = st.reads.find(request);
  auto& p = i->second;
  read_completion done;
  done.request_id = p.req.request_id;
  done.waited_for_buffer = p.waited;
  if (st.cfg.lease_runs) {
    // Runs complete in issue order (one NIC, paced in order), so they are
    // in block order already; sorted in case a pacer ever reorders.
    if (!std::is_sorted(p.runs.begin(), p.runs.end(), by_block_index))
      std::sort(p.runs.begin(), p.runs.end(), by_block_index);
    done.leases = std::move(p.runs);
    done.failed = std::move(p.failed);
    done.why_failed = std::move(p.why_failed);
  } else {
    done.leases.reserve(p.finished);
    for (size_t k = 0; k < p.leases.size(); ++k) {
      if (p.leases[k])
        done.leases.push_back(std::move(*p.leases[k]));
      else {
        done.failed.push_back(p.req.blocks[k]);
        done.why_failed.push_back(std::move(p.errors[k]));
      }
    }
  }
  st.queue.tokens -= p.req.tokens;
  st.queue.bytes -= payload_bytes(st) * p.req.blocks.size();
  st.queue.requests -= 1;
  observe_queue(st);
  if (auto& h = st.cfg.hooks) {
    if (h->tracing())
      h->span(observe::span_record{st.cfg.node, "snic", "storage read",
                                   p.req.request_id, -1, h->at(p.accepted_at),
                                   h->at(self->clock().now()), 0});
  }
  // (A holder gone meanwhile gets its leases freed here; the done handler
  // that completed this read pumps next.)
  holder_ends(st, p.req.holder, done.leases);
  auto promise = std::move(p.promise);
  st.reads.erase(i);
  promise.deliver(std::move(done));
}

// The oldest read with blocks left to issue (and its id), or nullptr. A
// request leaves the FIFO once all its blocks were issued; it may even have
// completed already (then it is gone from `reads`).
std::pair<uint64_t, pending_read*> next_to_issue(reader_state& st) {
  while (!st.fifo.empty()) {
    auto rid = st.fifo.front();
    auto i = st.reads.find(rid);
    if (i != st.reads.end() && i->second.next < i->second.req.blocks.size())
      return {rid, &i->second};
    st.fifo.pop_front();
  }
  return {0, nullptr};
}

// The read at the queue's front found no room in the buffer: it waits for a
// release (counted once per read).
void note_wait(reader_state& st) {
  auto [rid, p] = next_to_issue(st);
  if (p == nullptr || p->waited)
    return;
  p->waited = true;
  if (auto& h = st.cfg.hooks)
    h->count("dualpath_reader_buffer_waits_total", {{"node", st.cfg.node}});
}

// pump() for modeled reads without I/O threads (a simulation): the blocks
// of one request issued together become one job, completed by a single
// paced message at the last block's time instead of two messages per block.
// Each block still takes a slot, an in-flight place and its own reservation
// on the storage NIC, so the NIC's timeline is the same as block by block;
// in-flight places (and a missing block's slot) come back with the job.
void pump_modeled(self_ptr self) {
  auto& st = self->state;
  while (st.inflight < st.cfg.max_inflight) {
    auto [rid, next] = next_to_issue(st);
    if (next == nullptr)
      return;
    auto& p = *next;
    // Issue in runs of at least half the in-flight budget (or the rest of
    // the request): a run completing frees exactly its own places, so
    // issuing into whatever is free splits the budget into ever smaller
    // runs (3.4 blocks per message measured at 2P4D). Half the budget is
    // still queued on the NIC meanwhile, so it never idles for this.
    auto free = st.cfg.max_inflight - st.inflight;
    auto left = p.req.blocks.size() - p.next;
    if (st.inflight > 0 && free < (st.cfg.max_inflight + 1) / 2 && free < left)
      return;
    auto job = std::make_shared<io_job>();
    job->kind = io_job::read;
    job->request = rid;
    auto now = self->clock().now();
    job->ready_at = now;
    // The blocks this job may take, checked in the store at once.
    auto first = p.next;
    auto n = std::min<size_t>(p.req.blocks.size() - first,
                              st.cfg.max_inflight - st.inflight);
    st.present.resize(n);
    st.cfg.store->contains(p.req.blocks.data() + first, n, st.present.data());
    job->parts.reserve(n);
    while (p.next < first + n) {
      auto slot = acquire_place(st, true);
      if (!slot) {
        note_wait(st);
        break; // back-pressure: wait for a release
      }
      io_job::part part;
      part.index = p.next++;
      part.hash = p.req.blocks[part.index];
      part.slot = *slot;
      if (!st.present[part.index - first])
        part.err = caf::make_error(storage_errc::missing_block,
                                   "block not in the store");
      job->ready_at = paced(st, payload_bytes(st), now);
      job->parts.push_back(std::move(part));
      ++st.inflight;
    }
    if (job->parts.empty())
      return; // no slot
    auto id = st.next_id++;
    st.jobs.emplace(id, job);
    self->delayed_send(self, job->ready_at - now, done_atom_v, id);
  }
}

// Serves waiting reservations in order while the pool has room for the
// whole of the next one (a reservation is never served in part).
void serve_reserves(self_ptr self) {
  auto& st = self->state;
  // Reservations whose requesters stopped waiting are dropped first: served
  // late, their slots would never come back.
  auto now = self->clock().now();
  for (auto i = st.reserves.begin(); i != st.reserves.end();) {
    if (!i->expires || *i->expires > now) {
      ++i;
      continue;
    }
    i->rp.deliver(caf::make_error(
        caf::sec::request_timeout,
        "reservation of " + std::to_string(i->req.block_indices.size())
            + " slots for request " + std::to_string(i->req.request_id)
            + " not served within its timeout"));
    holder_ends(st, i->req.holder, {});
    i = st.reserves.erase(i);
  }
  while (!st.reserves.empty()) {
    auto& front = st.reserves.front();
    auto& req = front.req;
    auto& rp = front.rp;
    auto& waited = front.waited;
    auto n = static_cast<uint32_t>(req.block_indices.size());
    auto free_places = st.cfg.lease_runs
                           ? st.cfg.pool->slots() - st.run_places
                           : st.cfg.pool->slots() - st.cfg.pool->in_use();
    if (free_places < n) {
      if (!waited) {
        waited = true;
        if (auto& h = st.cfg.hooks)
          h->count("dualpath_reader_buffer_waits_total",
                   {{"node", st.cfg.node}});
      }
      return; // wait for releases
    }
    read_completion done;
    done.request_id = req.request_id;
    done.waited_for_buffer = waited;
    if (st.cfg.lease_runs) {
      st.run_places += n;
      st.leases += n;
      for (size_t k = 0; k < req.block_indices.size(); ++k) {
        auto idx = req.block_indices[k];
        if (!done.leases.empty()
            && done.leases.back().block_index + done.leases.back().blocks
                   == idx) {
          ++done.leases.back().blocks;
          continue;
        }
        buffer_lease run;
        run.lease_id = run_lease_bit | st.next_run++;
        run.block_index = idx;
        run.blocks = 1;
        done.leases.push_back(run);
      }
      for (auto& l : done.leases)
        st.runs.emplace(l.lease_id,
                        reader_state::run_places_of{l.blocks, false});
    } else {
      auto& pool = *st.cfg.pool;
      for (auto idx : req.block_indices) {
        auto slot = pool.acquire(); // room was checked above
        buffer_lease lease;
        lease.lease_id = (uint64_t{++st.lease_gen[*slot]} << 32) | *slot;
        lease.block_index = idx;
        lease.region = remote_region{st.cfg.node,
                                     st.cfg.region_id,
                                     st.cfg.region_key,
                                     reinterpret_cast<uint64_t>(pool.base()),
                                     pool.offset_of(*slot)
                                         + transport::storage::header_bytes,
                                     payload_bytes(st)};
        st.leased[*slot] = 2;
        ++st.leases;
        done.leases.push_back(std::move(lease));
      }
    }
    observe_buffer(st);
    holder_ends(st, req.holder, done.leases);
    auto promise = std::move(rp);
    st.reserves.pop_front();
    promise.deliver(std::move(done));
  }
}

// Issues blocks in FIFO order while slots and in-flight budget last (after
// the reservations, which go first).
void pump(self_ptr self) {
  auto& st = self->state;
  serve_reserves(self);
  if (!st.reserves.empty()) {
    note_wait(st);
    return; // a waiting reservation takes the next free slots
  }
  if (st.cfg.modeled_reads && !st.workers) {
    pump_modeled(self);
    return;
  }
  while (st.inflight < st.cfg.max_inflight) {
    auto [rid, next] = next_to_issue(st);
    if (next == nullptr)
      return;
    auto& p = *next;
    auto slot = acquire_place(st, true);
    if (!slot) {
      note_wait(st);
      return; // back-pressure: wait for a release
    }
    auto job = std::make_shared<io_job>();
    job->kind = io_job::read;
    job->request = rid;
    job->index = p.next++;
    job->hash = p.req.blocks[job->index];
    job->slot = *slot;
    job->ready_at = paced(st, payload_bytes(st), self->clock().now());
    auto id = st.next_id++;
    st.jobs.emplace(id, job);
    ++st.inflight;
    auto store = st.cfg.store;
    auto pool = st.cfg.pool;
    dispatch(
        self, id,
        [job, store, pool, modeled = st.cfg.modeled_reads] {
          if (modeled) {
            if (!store->contains(job->hash))
              job->err = caf::make_error(storage_errc::missing_block,
                                         "block not in the store");
            return;
          }
          auto hdr = store->read_full(job->hash, pool->slot(job->slot));
          if (!hdr)
            job->err = std::move(hdr.error());
        },
        job->ready_at);
  }
}

// Block `index` (in `slot`, failed with `err` or read) of read `request` is
// done; completes the read when it was its last block.
void complete_block(self_ptr self, uint64_t request, size_t index,
                    block_hash hash, uint32_t slot, caf::error& err) {
  auto& st = self->state;
  --st.inflight;
  auto& p = st.reads.at(request);
  auto& counters = st.cfg.counters;
  if (err) {
    if (index < p.errors.size())
      p.errors[index] = err;
    st.cfg.pool->release(slot);
    drop_read_place(st);
    if (counters)
      ++counters->blocks_failed;
    if (auto& h = st.cfg.hooks)
      h->count("dualpath_errors_total",
               {{"source", "storage_reader"}, {"kind", "read"}});
  } else {
    auto bytes = payload_bytes(st);
    buffer_lease lease;
    lease.lease_id = (uint64_t{++st.lease_gen[slot]} << 32) | slot;
    lease.hash = hash;
    lease.block_index = p.req.first_block + static_cast<uint32_t>(index);
    auto& pool = *st.cfg.pool;
    lease.region =
        remote_region{st.cfg.node,
                      st.cfg.region_id,
                      st.cfg.region_key,
                      reinterpret_cast<uint64_t>(pool.base()),
                      pool.offset_of(slot) + transport::storage::header_bytes,
                      bytes};
    st.leased[slot] = 1;
    ++st.leases;
    p.leases[index] = std::move(lease);
    if (counters) {
      ++counters->blocks_read;
      counters->bytes_read += bytes;
    }
    if (auto& h = st.cfg.hooks) {
      h->count("dualpath_storage_blocks_read_total", {{"node", st.cfg.node}});
      observe_buffer(st);
    }
  }
  if (++p.finished == p.req.blocks.size())
    finish_read(self, request);
}

// A modeled read job's blocks with lease_runs: each run of consecutive
// blocks read becomes one lease; a missing block fails alone and gives its
// place back.
void complete_run(self_ptr self, io_job& job) {
  auto& st = self->state;
  st.inflight -= static_cast<uint32_t>(job.parts.size());
  auto& p = st.reads.at(job.request);
  auto& counters = st.cfg.counters;
  auto& h = st.cfg.hooks;
  auto before = p.runs.size();
  buffer_lease* run = nullptr;
  size_t last_index = 0;
  for (auto& part : job.parts) {
    if (part.err) {
      --st.run_places;
      drop_read_place(st);
      p.failed.push_back(part.hash);
      p.why_failed.push_back(part.err);
      run = nullptr;
      if (counters)
        ++counters->blocks_failed;
      if (h)
        h->count("dualpath_errors_total",
                 {{"source", "storage_reader"}, {"kind", "read"}});
      continue;
    }
    if (run != nullptr && part.index == last_index + 1) {
      ++run->blocks;
    } else {
      p.runs.emplace_back();
      run = &p.runs.back();
      run->lease_id = run_lease_bit | st.next_run++;
      run->hash = part.hash;
      run->block_index = p.req.first_block + static_cast<uint32_t>(part.index);
      run->blocks = 1;
    }
    last_index = part.index;
    ++st.leases;
    if (counters) {
      ++counters->blocks_read;
      counters->bytes_read += payload_bytes(st);
    }
    if (h)
      h->count("dualpath_storage_blocks_read_total", {{"node", st.cfg.node}});
  }
  // Runs end with the job: a run's places are freed together.
  for (auto k = before; k < p.runs.size(); ++k)
    st.runs.emplace(p.runs[k].lease_id,
                    reader_state::run_places_of{p.runs[k].blocks, true});
  if (h)
    observe_buffer(st);
  p.finished += job.parts.size();
  if (p.finished == p.req.blocks.size())
    finish_read(self, job.request);
}

// Frees lease `lease_id`'s slot; false if it is unknown or released already.
bool release(reader_state& st, uint64_t lease_id) {
  // Only a reader with lease_runs has run leases (a slot lease's generation
  // may reach the top bit in a long run: it stays a slot lease).
  if (st.cfg.lease_runs) {
    auto i = st.runs.find(lease_id);
    if (i == st.runs.end())
      return false;
    st.run_places -= i->second.blocks;
    st.leases -= i->second.blocks;
    if (i->second.read)
      st.read_held -= std::min(st.read_held, i->second.blocks);
    st.runs.erase(i);
    forget_holder(st, lease_id);
    observe_buffer(st);
    return true;
  }
  auto slot = static_cast<uint32_t>(lease_id & 0xffff'ffffu);
  if (slot >= st.leased.size() || !st.leased[slot]
      || st.lease_gen[slot] != (lease_id >> 32))
    return false;
  if (st.leased[slot] == 1)
    drop_read_place(st);
  st.leased[slot] = 0;
  --st.leases;
  st.cfg.pool->release(slot);
  forget_holder(st, lease_id);
  observe_buffer(st);
  return true;
}

// Resolves a persist source to bytes: the configured resolver, else regions
// of this reader's own pool.
caf::expected<const std::byte*> resolve_source(reader_state& st,
                                               const remote_region& r) {
  if (st.cfg.resolve)
    return st.cfg.resolve(r);
  auto& pool = *st.cfg.pool;
  if (r.node == st.cfg.node && r.region_id == st.cfg.region_id
      && r.offset + r.length <= pool.size() && r.offset + r.length >= r.offset)
    return static_cast<const std::byte*>(pool.base() + r.offset);
  return caf::make_error(storage_errc::invalid_argument,
                         "cannot resolve region " + std::to_string(r.region_id)
                             + " of node " + r.node);
}

// The I/O threads, started by spawn_storage_reader before the actor exists
// and moved into its state when it first runs (spawn's arguments are
// copied, so they travel in a shared slot that the state empties).
using workers_slot =
    std::shared_ptr<std::unique_ptr<transport::storage::worker_pool>>;

reader_impl::behavior_type reader(self_ptr self, storage_reader_config cfg,
                                  workers_slot workers) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.workers = std::move(*workers);
  if (st.cfg.max_inflight == 0)
    st.cfg.max_inflight = 1;
  // Runs exist only where blocks complete together (pump_modeled).
  st.cfg.lease_runs = st.cfg.lease_runs && st.cfg.modeled_reads && !st.workers;
  st.lease_gen.assign(st.cfg.pool->slots(), 0);
  st.leased.assign(st.cfg.pool->slots(), 0);
  // A holder went down: nobody will release its leases, so the reader does;
  // its waiting reservations are dropped, its reads under way are freed as
  // they complete (holder_ends).
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.holders.find(dm.source);
    if (i == st.holders.end())
      return;
    auto& h = i->second;
    h.down = true;
    for (auto r = st.reserves.begin(); r != st.reserves.end();) {
      if (r->req.holder.address() != dm.source) {
        ++r;
        continue;
      }
      r->rp.deliver(caf::make_error(caf::sec::request_receiver_down,
                                    "reservation of request "
                                        + std::to_string(r->req.request_id)
                                        + " dropped: its holder went down"));
      h.pending -= std::min<uint32_t>(h.pending, 1);
      r = st.reserves.erase(r);
    }
    std::vector<uint64_t> held{h.leases.begin(), h.leases.end()};
    h.leases.clear();
    for (auto id : held)
      st.holder_of.erase(id);
    if (h.pending == 0)
      st.holders.erase(i);
    size_t freed = 0;
    for (auto id : held)
      freed += release(st, id) ? 1 : 0;
    if (auto& hooks = st.cfg.hooks; hooks && freed > 0)
      hooks->count("dualpath_reader_leases_reclaimed_total",
                   {{"node", st.cfg.node}}, static_cast<double>(freed));
    pump(self);
  });
  return {
      [self](read_atom, read_request& req) -> caf::result<read_completion> {
        auto& st = self->state;
        if (req.blocks.size() > read_cap(st))
          return caf::make_error(
              storage_errc::over_budget,
              std::to_string(req.blocks.size())
                  + " blocks exceed the reads' share of "
                  + std::to_string(read_cap(st)) + " of a pool of "
                  + std::to_string(st.cfg.pool->slots()) + " slots");
        if (req.blocks.empty()) {
          read_completion done;
          done.request_id = req.request_id;
          return done;
        }
        auto rp = self->make_response_promise<read_completion>();
        auto id = st.next_id++;
        pending_read p;
        if (!st.cfg.lease_runs)
          p.leases.resize(req.blocks.size());
        p.errors.resize(req.blocks.size());
        st.queue.tokens += req.tokens;
        st.queue.bytes += payload_bytes(st) * req.blocks.size();
        st.queue.requests += 1;
        holder_begins(self, req.holder);
        p.req = std::move(req);
        p.promise = rp;
        p.accepted_at = self->clock().now();
        observe_queue(st);
        st.reads.emplace(id, std::move(p));
        st.fifo.push_back(id);
        pump(self);
        return rp;
      },
      [self](reserve_atom,
             reserve_request& req) -> caf::result<read_completion> {
        auto& st = self->state;
        if (req.timeout_ns < 0)
          return caf::make_error(caf::sec::invalid_argument,
                                 "reserve_request::timeout_ns: "
                                     + std::to_string(req.timeout_ns)
                                     + " is negative (0: no limit)");
        if (req.block_indices.size() > st.cfg.pool->slots())
          return caf::make_error(
              storage_errc::over_budget,
              "reserving " + std::to_string(req.block_indices.size())
                  + " blocks exceeds a pool of "
                  + std::to_string(st.cfg.pool->slots()) + " slots");
        if (req.block_indices.empty()) {
          read_completion done;
          done.request_id = req.request_id;
          return done;
        }
        auto rp = self->make_response_promise<read_completion>();
        holder_begins(self, req.holder);
        reader_state::waiting_reserve w{std::move(req), rp, false, {}};
        if (w.req.timeout_ns > 0) {
          auto limit = std::chrono::nanoseconds{w.req.timeout_ns};
          w.expires = self->clock().now() + limit;
          // A reservation that still waits then is dropped then, even
          // when nothing else happens at the reader meanwhile.
          self->delayed_send(self, limit, done_atom_v);
        }
        st.reserves.push_back(std::move(w));
        pump(self);
        return rp;
      },
      [self](release_atom, uint64_t lease_id) {
        if (release(self->state, lease_id))
          pump(self);
      },
      [self](release_atom, const lease_release& r) {
        bool any = false;
        for (auto id : r.lease_ids)
          any = release(self->state, id) || any;
        if (any)
          pump(self);
      },
      [self](persist_atom, persist_request& req) -> caf::result<block_hash> {
        auto& st = self->state;
        auto store = st.cfg.store;
        auto& geo = store->geometry();
        const std::byte* src = nullptr;
        if (req.source.length != 0) {
          if (req.source.length != geo.payload_bytes())
            return caf::make_error(storage_errc::invalid_argument,
                                   "persist source of "
                                       + std::to_string(req.source.length)
                                       + " bytes, block payload is "
                                       + std::to_string(geo.payload_bytes()));
          auto r = resolve_source(st, req.source);
          if (!r)
            return std::move(r.error());
          src = *r;
        }
        auto job = std::make_shared<io_job>();
        job->kind = io_job::write;
        job->hash = req.hash;
        job->ready_at = paced(st, geo.payload_bytes(), self->clock().now());
        job->write_promise = self->make_response_promise<block_hash>();
        auto id = st.next_id++;
        st.jobs.emplace(id, job);
        auto parent = req.parent;
        dispatch(
            self, id,
            [job, store, src, parent] {
              if (!src) {
                // No source bytes: the deterministic KV content of this block
                // (what a decode engine computes for it in this emulation).
                job->err = store->write_generated(job->hash, parent);
                return;
              }
              auto& geo = store->geometry();
              auto buf =
                  transport::storage::aligned_buffer::make(geo.file_bytes());
              if (!buf) {
                job->err = std::move(buf.error());
                return;
              }
              std::memcpy(buf->data() + transport::storage::header_bytes, src,
                          geo.payload_bytes());
              job->err = transport::storage::seal_block(
                  geo, store->config().model_id, job->hash, parent,
                  buf->data());
              if (!job->err)
                job->err = store->write(job->hash, parent, buf->data());
            },
            job->ready_at);
        return job->write_promise;
      },
      [self](persist_atom, persist_batch& req) -> caf::result<uint32_t> {
        auto& st = self->state;
        auto n = req.hashes.size();
        if (n == 0 || n > max_persist_batch)
          return caf::make_error(
              storage_errc::invalid_argument,
              "persist batch of " + std::to_string(n) + " blocks (1 to "
                  + std::to_string(max_persist_batch) + " allowed)");
        auto job = std::make_shared<io_job>();
        job->kind = io_job::write_batch;
        auto now = self->clock().now();
        for (size_t k = 0; k < n; ++k)
          job->ready_at = paced(st, payload_bytes(st), now);
        job->batch = std::move(req);
        job->batch_promise = self->make_response_promise<uint32_t>();
        auto id = st.next_id++;
        st.jobs.emplace(id, job);
        auto store = st.cfg.store;
        dispatch(
            self, id,
            [job, store] {
              auto parent = job->batch.parent;
              for (auto h : job->batch.hashes) {
                job->err = store->write_generated(h, parent);
                if (job->err)
                  return;
                ++job->written;
                parent = h;
              }
            },
            job->ready_at);
        return job->batch_promise;
      },
      [self](queue_atom) { return self->state.queue; },
      [self](done_atom) { pump(self); },
      [self](done_atom, uint64_t id) {
        auto& st = self->state;
        auto i = st.jobs.find(id);
        if (i == st.jobs.end())
          return;
        auto job = i->second;
        auto now = self->clock().now();
        if (now < job->ready_at) {
          // The disk was faster than the emulated NIC: complete at the paced
          // time.
          self->delayed_send(self, job->ready_at - now, done_atom_v, id);
          return;
        }
        st.jobs.erase(i);
        if (job->kind == io_job::read) {
          if (st.cfg.lease_runs) {
            complete_run(self, *job);
            pump(self);
            return;
          }
          if (job->parts.empty())
            complete_block(self, job->request, job->index, job->hash, job->slot,
                           job->err);
          for (auto& part : job->parts)
            complete_block(self, job->request, part.index, part.hash, part.slot,
                           part.err);
          pump(self);
          return;
        }
        auto& counters = st.cfg.counters;
        if (job->kind == io_job::write_batch) {
          auto failed = job->batch.hashes.size() - job->written;
          if (counters) {
            counters->blocks_written += job->written;
            counters->bytes_written += payload_bytes(st) * job->written;
            counters->writes_failed += failed;
          }
          if (auto& h = st.cfg.hooks) {
            for (uint32_t k = 0; k < job->written; ++k)
              h->count("dualpath_storage_blocks_persisted_total",
                       {{"node", st.cfg.node}});
            if (failed > 0)
              h->count("dualpath_errors_total",
                       {{"source", "storage_reader"}, {"kind", "persist"}});
          }
          job->batch_promise.deliver(job->written);
          return;
        }
        if (job->err) {
          if (counters)
            ++counters->writes_failed;
          if (auto& h = st.cfg.hooks)
            h->count("dualpath_errors_total",
                     {{"source", "storage_reader"}, {"kind", "persist"}});
          job->write_promise.deliver(std::move(job->err));
          return;
        }
        if (counters) {
          ++counters->blocks_written;
          counters->bytes_written += payload_bytes(st);
        }
        if (auto& h = st.cfg.hooks)
          h->count("dualpath_storage_blocks_persisted_total",
                   {{"node", st.cfg.node}});
        job->write_promise.deliver(job->hash);
      },
  };
}

} // namespace

storage_reader_config::pace_fn
pace_with(std::shared_ptr<transport::link_pacer> pacer) {
  return [pacer](uint64_t bytes, storage_reader_config::time_point now) {
    return pacer->reserve(bytes, now);
  };
}

caf::expected<storage_reader_actor>
spawn_storage_reader(caf::actor_system& sys, storage_reader_config cfg) {
  if (!cfg.store || !cfg.pool)
    return caf::make_error(storage_errc::invalid_argument,
                           "storage reader needs a store and a buffer pool");
  if (cfg.pool->slot_bytes() < cfg.store->geometry().file_bytes())
    return caf::make_error(
        storage_errc::invalid_argument,
        "buffer pool slots of " + std::to_string(cfg.pool->slot_bytes())
            + " bytes cannot hold block files of "
            + std::to_string(cfg.store->geometry().file_bytes()));
  // The I/O threads start here, so a reader that spawn returns has them
  // running (named and in their CPU class), and one that cannot start them
  // is an error for the caller, not an actor that quits later.
  auto workers =
      std::make_shared<std::unique_ptr<transport::storage::worker_pool>>();
  if (cfg.io_threads > 0) {
    *workers = std::make_unique<transport::storage::worker_pool>(
        cfg.io_threads, cfg.io_thread_start);
    if (auto& err = (*workers)->start_error())
      return caf::make_error(storage_errc::io_error,
                             "storage reader of " + cfg.node
                                 + ": I/O thread: " + caf::to_string(err));
  }
  auto impl = sys.spawn(reader, std::move(cfg), std::move(workers));
  return caf::actor_cast<storage_reader_actor>(impl);
}

} // namespace dualpath::actors
