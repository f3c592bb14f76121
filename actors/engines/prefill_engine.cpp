#include "actors/engines/prefill_engine.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/type_id.hpp>

#include "actors/engines/engine_common.hpp"
#include "actors/engines/kv_layout.hpp"
#include "actors/engines/layer_streamer.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "gpu/device.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, fetch_tick_atom,
             "petick")

namespace dualpath::actors {

namespace {

using namespace dualpath::actors::prefill_atoms;

// The reply to one work batch: its requests become jobs and the reply joins
// them (bytes moved add up; the last job's layer timings are kept).
struct batch_reply {
  caf::typed_response_promise<stream_report> rp;
  stream_report report;
  size_t left = 0;
  bool failed = false;
};

// One request on its way through the engine (see the header for the phases).
struct job {
  uint64_t id = 0; // engine-local, increasing in arrival order
  assignment a;
  read_plan plan;      // after plan_for
  read_plan effective; // after read errors
  std::vector<block_hash> hashes;
  std::shared_ptr<batch_reply> reply;
  decode_slot slot;
  bool started = false;
  bool admit_sent = false;
  bool admitted = false;
  bool pe_read_done = false;
  bool de_read_done = false;
  bool ready = false;  // reads in, decode engine told
  bool handed = false; // stream request sent to the streamer
  read_completion pe_read;
  read_completion de_read;
  emulated_time::time_point started_at{};
  int64_t read_ns = 0;
  std::vector<uint64_t> leases; // released once streamed
};

using job_ptr = std::unique_ptr<job>;

struct prefill_state {
  engine_config cfg;
  std::shared_ptr<pe_staging> staging;
  layer_streamer_actor streamer;
  // Unfinished jobs in arrival order; the first `lookahead + 1` are started.
  std::deque<job_ptr> jobs;
  uint64_t next_job = 1;
  // seq_e / tok_e: requests assigned here and not yet fully sent.
  uint32_t seq = 0;
  uint64_t tok = 0;
  static inline const char* name = "prefill_engine";
};

using self_ptr = caf::stateful_actor<prefill_state>*;

void pump(self_ptr self);

job* find_job(self_ptr self, uint64_t id) {
  for (auto& j : self->state.jobs)
    if (j->id == id)
      return j.get();
  return nullptr;
}

void release_leases(self_ptr self, const std::vector<uint64_t>& leases) {
  auto& reader = self->state.cfg.node->reader;
  if (!reader)
    return;
  if (!leases.empty())
    self->send(reader, release_atom_v, lease_release{leases});
}

// A job failed: its decode engine drops what it holds for it (an admission
// or a slot) and the scheduler re-queues the request (or fails it after
// max_attempts), so neither the request nor the buffer space is lost.
void report_failure(self_ptr self, const job& j, const caf::error& err) {
  auto& cfg = self->state.cfg;
  if (j.admit_sent && j.a.decode_actor)
    self->send(caf::actor_cast<decode_engine_actor>(j.a.decode_actor),
               release_atom_v, j.a.request.id);
  if (cfg.scheduler)
    self->send(caf::actor_cast<scheduler_actor>(cfg.scheduler), fail_atom_v,
               request_failure{j.a.request.id, cfg.id, err});
  if (cfg.hooks)
    cfg.hooks->count("dualpath_errors_total",
                     {{"source", "prefill_engine"}, {"kind", "request"}});
}

// Removes job `id` (done or failed): frees its leases and its share of
// seq_e / tok_e, answers its batch when `err` or when it was the last job of
// the batch, and starts the next jobs.
void finish(self_ptr self, uint64_t id, caf::error err,
            stream_report rep = {}) {
  auto& st = self->state;
  auto i = std::find_if(st.jobs.begin(), st.jobs.end(),
                        [id](const job_ptr& j) { return j->id == id; });
  if (i == st.jobs.end())
    return;
  job_ptr j = std::move(*i);
  st.jobs.erase(i);
  if (err)
    report_failure(self, *j, err);
  // Leases of a job that failed before it was ready are still in pe_read.
  if (!j->ready)
    for (auto& l : j->pe_read.leases)
      j->leases.push_back(l.lease_id);
  release_leases(self, j->leases);
  st.seq -= std::min<uint32_t>(st.seq, 1);
  st.tok -= std::min<uint64_t>(st.tok, j->a.request.tokens.size());
  auto& r = *j->reply;
  if (!r.failed) {
    if (err) {
      r.failed = true;
      r.rp.deliver(std::move(err));
    } else {
      r.report.bytes_moved += rep.bytes_moved;
      if (!rep.layers.empty()) {
        rep.layers.front().read_ns = j->read_ns;
        r.report.layers = std::move(rep.layers);
      }
      r.report.batch_id = rep.batch_id;
      if (--r.left == 0)
        r.rp.deliver(std::move(r.report));
    }
  }
  pump(self);
}

// Hands ready jobs to the streamer in arrival order (the streamer serves
// one batch at a time, the rest wait in its queue).
void hand_over(self_ptr self) {
  auto& st = self->state;
  auto& cfg = st.cfg;
  const auto bt = cfg.model.block_tokens;
  for (auto& jp : st.jobs) {
    auto& j = *jp;
    if (j.handed)
      continue;
    if (!j.ready)
      return; // keep the order
    j.handed = true;
    stream_plan plan;
    plan.batch_id = j.id;
    plan.layers = cfg.model.layers;
    plan.window = cfg.layer_window;
    stream_item s;
    s.request_id = j.a.request.id;
    s.tokens = static_cast<uint32_t>(j.a.request.tokens.size());
    s.hit_blocks = j.effective.hit_blocks;
    s.pe_side_blocks = j.effective.pe_side_blocks;
    s.miss_tokens = s.tokens - std::min(s.tokens, s.hit_blocks * bt);
    s.destination = j.slot.kv_buffer;
    s.decode_actor = j.a.decode_actor;
    if (cfg.real_bytes)
      s.hashes = j.hashes; // miss KV is computed from them (real bytes only)
    // The job is ready: its lease ids are in j.leases, the leases move on.
    s.hits.reserve(j.pe_read.leases.size());
    for (auto& l : j.pe_read.leases)
      if (l.block_index < s.pe_side_blocks)
        s.hits.push_back(std::move(l));
    plan.items.push_back(std::move(s));
    auto id = j.id;
    self->request(st.streamer, caf::infinite, stream_atom_v, std::move(plan))
        .then(
            [self, id](stream_report& rep) {
              finish(self, id, caf::error{}, std::move(rep));
            },
            [self, id](caf::error& err) { finish(self, id, std::move(err)); });
  }
}

// Both reads of a job are in and it is admitted: decide its effective hits
// (the first failed or missing block and every later one become misses) and
// tell the decode engine.
void job_ready(self_ptr self, job& j) {
  auto& cfg = self->state.cfg;
  const auto bt = cfg.model.block_tokens;
  uint32_t hit = j.plan.hit_blocks;
  auto first_failed = [&](const read_completion& c) {
    for (auto h : c.failed)
      for (uint32_t k = 0; k < j.plan.hit_blocks; ++k)
        if (j.hashes[k] == h)
          hit = std::min(hit, k);
  };
  first_failed(j.pe_read);
  first_failed(j.de_read);
  if (cfg.mode != load_mode::oracle) {
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
  uint64_t read_pe = 0;
  j.leases.reserve(j.leases.size() + j.pe_read.leases.size());
  for (auto& l : j.pe_read.leases) {
    j.leases.push_back(l.lease_id);
    read_pe += uint64_t{bt} * l.blocks * cfg.model.layers
               * cfg.model.nominal_bytes_per_token_layer;
  }
  j.effective = read_plan{hit, std::min(j.plan.pe_side_blocks, hit)};
  self->send(
      caf::actor_cast<decode_engine_actor>(j.a.decode_actor), prefilled_atom_v,
      prefill_summary{j.a.request.id, hit, j.plan.hit_blocks - hit, read_pe});
  j.read_ns = to_ns(emulated_now(self, cfg.time) - j.started_at);
  j.ready = true;
  hand_over(self);
}

void check_job(self_ptr self, job& j) {
  if (!j.ready && j.admitted && j.pe_read_done && j.de_read_done)
    job_ready(self, j);
}

// DE side: the decode engine starts its read at admission, so its leases are
// asked for only once the request is admitted there (a `load` before the
// admission would find no request).
void request_de_read(self_ptr self, job& j) {
  auto id = j.id;
  auto de = caf::actor_cast<decode_engine_actor>(j.a.decode_actor);
  self->request(de, caf::infinite, load_atom_v, j.a.request.id)
      .then(
          [self, id](read_completion& c) {
            if (auto j = find_job(self, id)) {
              j->de_read = std::move(c);
              j->de_read_done = true;
              check_job(self, *j);
            }
          },
          [self, id](caf::error&) {
            // No DE-side leases: those blocks are recomputed.
            if (auto j = find_job(self, id)) {
              j->de_read = read_completion{};
              j->de_read.request_id = j->a.request.id;
              j->de_read.failed.assign(j->hashes.begin()
                                           + j->plan.pe_side_blocks,
                                       j->hashes.begin() + j->plan.hit_blocks);
              j->de_read_done = true;
              check_job(self, *j);
            }
          });
}

// Admissions go out one at a time in arrival order: a job asks its decode
// engine for a slot only once every earlier job of this engine holds one.
// Decode slots are therefore never held by a later job while an earlier one
// waits, which rules out the cyclic wait across engines that concurrent
// admissions allowed.
void admit_next(self_ptr self) {
  for (auto& jp : self->state.jobs) {
    auto& j = *jp;
    if (!j.started)
      return;
    if (j.admitted)
      continue;
    if (j.admit_sent)
      return; // wait for it
    j.admit_sent = true;
    auto id = j.id;
    auto de = caf::actor_cast<decode_engine_actor>(j.a.decode_actor);
    auto admitted = j.a;
    admitted.plan = j.plan;
    self->request(de, caf::infinite, admit_atom_v, std::move(admitted))
        .then(
            [self, id](decode_slot& slot) {
              auto j = find_job(self, id);
              if (!j)
                return;
              j->slot = std::move(slot);
              j->admitted = true;
              if (!j->de_read_done)
                request_de_read(self, *j);
              check_job(self, *j);
              if (find_job(self, id))
                admit_next(self);
            },
            [self, id](caf::error& err) { finish(self, id, std::move(err)); });
    return;
  }
}

// Starts a job: its PE-side read goes to this node's reader now (reads are
// issued in arrival order, so the reader's FIFO serves earlier jobs first).
void start_job(self_ptr self, job& j) {
  auto& cfg = self->state.cfg;
  j.started = true;
  j.started_at = emulated_now(self, cfg.time);
  const bool reads = cfg.mode != load_mode::oracle;
  j.de_read_done = !(reads && j.plan.hit_blocks > j.plan.pe_side_blocks);
  if (reads && j.plan.pe_side_blocks > 0 && cfg.node->reader) {
    read_request rr;
    rr.request_id = j.a.request.id;
    rr.blocks.assign(j.hashes.begin(),
                     j.hashes.begin() + j.plan.pe_side_blocks);
    rr.first_block = 0;
    rr.tokens = j.plan.pe_side_blocks * cfg.model.block_tokens;
    auto id = j.id;
    read_blocks(self, cfg.node->reader, std::move(rr),
                [self, id](read_completion c) {
                  auto j = find_job(self, id);
                  if (!j) {
                    std::vector<uint64_t> ids;
                    for (auto& l : c.leases)
                      ids.push_back(l.lease_id);
                    release_leases(self, ids);
                    return;
                  }
                  j->pe_read = std::move(c);
                  j->pe_read_done = true;
                  check_job(self, *j);
                });
  } else {
    j.pe_read_done = true;
  }
}

engine_load own_load(self_ptr self);

// seq_e / tok_e change only where jobs come and go, and both end in pump().
void publish(self_ptr self) {
  publish_load(self->state.cfg, own_load(self));
}

// Starts the jobs inside the look-ahead window, then the admissions.
void pump(self_ptr self) {
  auto& st = self->state;
  size_t window = size_t{st.cfg.prefill_lookahead} + 1;
  size_t n = 0;
  for (auto& jp : st.jobs) {
    if (n++ >= window)
      break;
    if (!jp->started)
      start_job(self, *jp);
  }
  admit_next(self);
  // Jobs that need neither reads nor a pending admission may be ready now.
  for (size_t k = 0; k < std::min(window, st.jobs.size()); ++k)
    check_job(self, *st.jobs[k]);
  publish(self);
}

engine_load own_load(self_ptr self) {
  auto& st = self->state;
  return own_load_of(st.cfg, st.seq, st.tok);
}

caf::result<engine_load> status(self_ptr self) {
  return load_with_read_queue(self, [self] { return own_load(self); });
}

void schedule_fetch(self_ptr self) {
  auto& cfg = self->state.cfg;
  auto d = cfg.time.to_actor(std::chrono::nanoseconds(cfg.fetch_period_ns));
  self->delayed_send(self, d, fetch_tick_atom_v);
}

// Group leader: a member's batch failed (its engine reported each request).
void member_failed(self_ptr self, const caf::error& err) {
  auto& cfg = self->state.cfg;
  if (cfg.hooks)
    cfg.hooks->count("dualpath_errors_total",
                     {{"source", "prefill_engine"}, {"kind", "batch"}});
  if (cfg.observer) {
    event_record ev;
    ev.source = cfg.id.node + "/prefill" + std::to_string(cfg.id.rank);
    ev.kind = "batch_failed";
    ev.at_ns = since_start(cfg.time, emulated_now(self, cfg.time));
    ev.detail = caf::to_string(err);
    self->send(cfg.observer, event_atom_v, std::move(ev));
  }
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
  auto board = cfg.node ? cfg.node->loads : nullptr;
  auto done = [self, g, board] {
    auto& cfg = self->state.cfg;
    auto own = own_load(self);
    if (board) {
      auto q = board->read_queue();
      own.read_q_tokens = q.tokens;
      own.read_q_bytes = q.bytes;
    }
    g->report.engines.insert(g->report.engines.begin(), std::move(own));
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
                      .then([](stream_report&) {},
                            [self](caf::error& err) {
                              // Each failed request was reported to the
                              // scheduler by the engine that held it
                              // (report_failure); the leader records that a
                              // member's batch failed.
                              member_failed(self, err);
                            });
              schedule_fetch(self);
            },
            [self](caf::error&) { schedule_fetch(self); });
  };
  if (members.empty()) {
    done();
    return;
  }
  if (board) {
    // The members' loads as they last published them (no messages).
    g->report.engines = board->others(cfg.id.rank);
    g->left = 0;
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
  // A decode engine was lost (its node died; in a deployment the node agent
  // passes the notice on, since a request to an actor of a node lost behind
  // the scheduler node is never answered): jobs waiting for it fail now, so
  // the engine goes on and the scheduler re-queues their requests; the
  // streamer drops the batches it holds for it.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    caf::anon_send(caf::actor_cast<caf::actor>(st.streamer), dm);
    std::vector<uint64_t> lost;
    for (auto& j : st.jobs)
      if (!j->handed && j->a.decode_actor
          && j->a.decode_actor.address() == dm.source)
        lost.push_back(j->id);
    for (auto id : lost)
      finish(self, id,
             caf::make_error(caf::sec::request_receiver_down,
                             "decode engine lost"));
  });
  auto& c = self->state.cfg;
  if (leads_group(c))
    schedule_fetch(self);
  publish(self);
  return {
      [self](prefill_atom, work_batch& w) -> caf::result<stream_report> {
        auto& st = self->state;
        auto& cfg = st.cfg;
        auto reply = std::make_shared<batch_reply>();
        reply->rp = self->make_response_promise<stream_report>();
        reply->left = w.items.size();
        if (w.items.empty()) {
          reply->rp.deliver(stream_report{});
          return reply->rp;
        }
        // Every request becomes its own job: a job holds buffer leases and a
        // decode slot only for itself, so jobs never wait on each other's
        // reads (see admit_next for the admission order).
        for (auto& a : w.items) {
          ++st.seq;
          st.tok += a.request.tokens.size();
          auto j = std::make_unique<job>();
          j->id = st.next_job++;
          j->hashes =
              prompt_block_hashes(a.request.tokens, cfg.model.block_tokens);
          auto full = static_cast<uint32_t>(a.request.tokens.size()
                                            / cfg.model.block_tokens);
          j->plan = plan_for(cfg.mode, a.plan, full);
          j->a = std::move(a);
          j->reply = reply;
          st.jobs.push_back(std::move(j));
        }
        pump(self);
        return reply->rp;
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
