#include "actors/placement/global_scheduler.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/protocol/decode_engine_actor.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "transport/storage/block_store.hpp"

namespace dualpath::actors {

namespace {

// A request between submit and done.
struct tracked_request {
  request_spec spec;
  scheduler::request_info info;
  caf::typed_response_promise<request_result> promise;
  bool assigned = false; // has a prefill engine and a read plan
  scheduler::fetch_decision decision;
  bool dispatched = false; // sent to its prefill engine
  uint32_t decode = 0;     // decode engine index once dispatched
  // Times the request was re-queued after losing an engine; engines see the
  // id `spec.id + (attempt << attempt_shift)`, so a late message of an
  // earlier attempt can never be mistaken for the current one.
  uint32_t attempt = 0;
};

// Request ids the engines see carry the attempt in their top bits.
constexpr int attempt_shift = 48;
constexpr uint64_t id_mask = (uint64_t{1} << attempt_shift) - 1;

// Engine identity (node, rank) -> dense index. Every fetch and report
// carries a group's engines, 100 times per simulated second per group: one
// hash of the node name and an array access per engine (an ordered map of
// (string, rank) tuples took several string compares each).
class engine_index {
public:
  void add(const engine_id& id, uint32_t index) {
    auto& ranks = by_node_[id.node];
    if (ranks.size() <= id.rank)
      ranks.resize(id.rank + 1, none);
    ranks[id.rank] = index;
  }

  std::optional<uint32_t> find(const engine_id& id) const {
    auto i = by_node_.find(id.node);
    if (i == by_node_.end() || id.rank >= i->second.size()
        || i->second[id.rank] == none)
      return std::nullopt;
    return i->second[id.rank];
  }

private:
  static constexpr uint32_t none = ~uint32_t{0};
  std::unordered_map<std::string, std::vector<uint32_t>> by_node_;
};

struct scheduler_state {
  static inline const char* name = "dualpath.scheduler";

  scheduler_config cfg;
  scheduler::cluster_state st;
  std::unique_ptr<scheduler::placement_policy> policy;
  std::deque<scheduler::request_info> waiting;
  std::unordered_map<uint64_t, tracked_request> requests;
  // Engine identities -> dense indices and handles.
  engine_index pe_index;
  engine_index de_index;
  std::vector<caf::actor> pe_actor;
  std::vector<caf::actor> de_actor;
  // Prefill engines of each prefill group (candidates of that group's fetch).
  std::vector<std::vector<uint32_t>> pe_groups;
  std::vector<uint32_t> all_pes;
  // Engines whose actor went down (monitored), until they enroll again.
  std::vector<bool> pe_lost;
  std::vector<bool> de_lost;
  /// How many of pe_lost and de_lost are set: while none is, drain_lost()
  /// has nothing to do (it runs after every fetch; its walk over every
  /// group's pending requests then only costs time).
  uint32_t lost_engines = 0;
  // Requests dispatched to each decode engine and not yet done: its seq_e
  // and tok_e as the scheduler knows them. A decode engine's own report
  // counts a request only from its admission, which waits until the prefill
  // engine starts the job (behind its queue); taken from the reports, a
  // group's load dropped at every report by the requests still queued at
  // prefill engines, and every fetch sent more work to the groups whose
  // reports understated most (at 2P4D, 2,048 agents: JCT 95 s vs 64 s for
  // round robin).
  std::vector<uint32_t> de_seq;
  std::vector<uint64_t> de_tok;
  scheduler_counters counters;
  /// Per agent: the hit prefix its last prompt had (length and last block's
  /// hash). The store never drops a block and a block hash names its whole
  /// prefix, so when the next prompt's block at that position has that hash
  /// the prefix is still a hit and only later blocks are probed (an agentic
  /// turn adds ~2% to a prompt of ~500 blocks, in an index of tens of
  /// millions where every probe misses the caches).
  std::unordered_map<uint64_t, std::pair<size_t, block_hash>> agent_hits;
};

// The prompt's hit blocks in the store (lookup()'s length), probing only
// past the agent's known hit prefix.
size_t known_hits(scheduler_state& s, uint64_t agent,
                  const token_list::hash_span& hashes) {
  auto& [known, last] = s.agent_hits[agent];
  size_t from = 0;
  if (known > 0 && known <= hashes.size && hashes.data()[known - 1] == last)
    from = known;
  auto parent = from > 0 ? last : transport::root_hash;
  auto hits =
      from
      + s.cfg.store->hit_run(hashes.data() + from, hashes.size - from, parent);
  if (hits > 0) {
    known = hits;
    last = hashes.data()[hits - 1];
  }
  return hits;
}

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

// Turns a request whose PE and DE are both known into an assignment.
assignment make_assignment(scheduler_state& s, tracked_request& t,
                           uint32_t decode_index) {
  assignment a;
  a.request = t.spec;
  a.request.id = t.spec.id + (uint64_t{t.attempt} << attempt_shift);
  a.prefill = s.cfg.prefill[t.decision.prefill].id;
  a.decode = s.cfg.decode[decode_index].id;
  a.plan.hit_blocks = t.decision.reads.hit_blocks;
  a.plan.pe_side_blocks = t.decision.reads.pe_side_blocks;
  a.prefill_actor = s.pe_actor[t.decision.prefill];
  a.decode_actor = s.de_actor[decode_index];
  return a;
}

void emit_event(self_ptr self, const std::string& kind, uint64_t id,
                const std::string& detail) {
  if (!self->state.cfg.observer)
    return;
  event_record ev;
  ev.source = "scheduler";
  ev.kind = kind;
  ev.request_id = id;
  ev.at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 self->clock().now().time_since_epoch())
                 .count();
  ev.detail = detail;
  self->send(self->state.cfg.observer, event_atom_v, std::move(ev));
}

// Observation (null hooks: nothing): an engine's reported load as gauges.
void observe_load(const scheduler_state& s, const engine_load& e) {
  auto& h = s.cfg.hooks;
  if (!h)
    return;
  observe::label_set engine{{"node", e.engine.node},
                            {"engine", std::to_string(e.engine.rank)}};
  h->gauge("dualpath_engine_requests", engine, e.seq);
  h->gauge("dualpath_engine_tokens", engine, static_cast<double>(e.tok));
  if (e.engine.role == engine_role::decode)
    h->gauge("dualpath_engine_free_hbm_bytes", engine,
             static_cast<double>(e.free_hbm_bytes));
}

// Observation: a finished request's latencies and errors (reroutes are
// counted by requeue()).
void observe_done(const scheduler_state& s, const request_result& r) {
  auto& h = s.cfg.hooks;
  if (!h)
    return;
  h->count("dualpath_requests_completed_total", {});
  h->observe("dualpath_ttft_seconds", {}, static_cast<double>(r.ttft_ns) / 1e9);
  if (r.tpot_ns > 0)
    h->observe("dualpath_tpot_seconds", {},
               static_cast<double>(r.tpot_ns) / 1e9);
  if (r.verify_failures > 0)
    h->count("dualpath_errors_total",
             {{"source", "decode_engine"}, {"kind", "verify"}},
             r.verify_failures);
}

// Records the decisions of one policy call. Assignments of `for_group` (the
// fetching prefill group) are returned; the others are pushed to their
// prefill engines at once.
work_batch apply(self_ptr self, const scheduler::fetch_result& res,
                 int64_t for_group) {
  auto& s = self->state;
  for (auto& d : res.assigned) {
    auto i = s.requests.find(d.request.id);
    if (i == s.requests.end())
      continue;
    i->second.assigned = true;
    i->second.decision = d;
    ++s.counters.assigned;
  }
  work_batch reply;
  // Per prefill group (one engine actor per node): its handle and requests.
  std::map<uint32_t, std::pair<caf::actor, work_batch>> pushes;
  for (auto& p : res.placed) {
    auto i = s.requests.find(p.request_id);
    if (i == s.requests.end() || !i->second.assigned || i->second.dispatched)
      continue;
    auto& t = i->second;
    t.dispatched = true;
    t.decode = p.decode;
    ++s.de_seq[p.decode];
    s.de_tok[p.decode] += t.info.prompt_tokens;
    ++s.counters.placed;
    auto a = make_assignment(s, t, p.decode);
    // The decode node starts the request's decode-side read now, before
    // any prefill engine asks it for room (reads never wait on admission).
    if (a.decode_actor)
      caf::anon_send(caf::actor_cast<decode_engine_actor>(a.decode_actor),
                     assign_atom_v, a);
    auto pe = t.decision.prefill;
    auto group = s.cfg.prefill[pe].group;
    if (static_cast<int64_t>(group) == for_group) {
      reply.items.push_back(std::move(a));
    } else {
      auto& [hdl, batch] = pushes[group];
      hdl = s.pe_actor[pe];
      batch.items.push_back(std::move(a));
    }
  }
  for (auto& [group, push] : pushes)
    if (push.first)
      caf::anon_send(caf::actor_cast<prefill_engine_actor>(push.first),
                     prefill_atom_v, std::move(push.second));
  return reply;
}

// A decode group all of whose engines are lost takes no new requests.
bool group_lost(const scheduler_state& s, uint32_t group) {
  for (auto m : s.st.decode_groups[group].members)
    if (!s.de_lost[m])
      return false;
  return true;
}

// Puts a request that lost its engine back at the head of the waiting queue
// (its result still goes to the original submitter, exactly once).
// A dispatched request leaves its decode engine's outstanding load.
void undispatch(scheduler_state& s, tracked_request& t) {
  if (!t.dispatched || t.decode >= s.de_seq.size())
    return;
  s.de_seq[t.decode] -= std::min<uint32_t>(s.de_seq[t.decode], 1);
  s.de_tok[t.decode] -=
      std::min<uint64_t>(s.de_tok[t.decode], t.info.prompt_tokens);
}

void requeue(self_ptr self, tracked_request& t, const std::string& why) {
  auto& s = self->state;
  undispatch(s, t);
  t.assigned = false;
  t.dispatched = false;
  ++t.attempt;
  ++s.counters.rerouted;
  s.waiting.push_front(t.info);
  emit_event(self, "reroute", t.spec.id, why);
  // Counted when it happens (a rerouted request may never complete).
  if (s.cfg.hooks)
    s.cfg.hooks->count("dualpath_reroutes_total", {});
}

// Requests routed to a lost decode group (or assigned to a lost prefill
// engine) that no engine holds yet go back to the waiting queue; no engine
// ever held them, so they are not counted as rerouted.
void drain_lost(self_ptr self) {
  auto& s = self->state;
  if (s.lost_engines == 0)
    return;
  for (uint32_t g = 0; g < s.st.decode_groups.size(); ++g) {
    auto& pend = s.st.decode_groups[g].pending;
    bool lost = group_lost(s, g);
    for (auto i = pend.begin(); i != pend.end();) {
      auto t = s.requests.find(i->id);
      bool pe_gone = t != s.requests.end() && t->second.assigned
                     && s.pe_lost[t->second.decision.prefill];
      if (!lost && !pe_gone) {
        ++i;
        continue;
      }
      if (t != s.requests.end() && !t->second.dispatched) {
        t->second.assigned = false;
        s.waiting.push_front(t->second.info);
      }
      s.st.decode_groups[g].total_tokens -= std::min<uint64_t>(
          s.st.decode_groups[g].total_tokens, i->prompt_tokens);
      i = pend.erase(i);
    }
    if (lost) // never the least loaded group while it is gone
      s.st.decode_groups[g].total_tokens = uint64_t{1} << 62;
  }
}

// An engine went down: stop choosing it and re-queue what it held.
void engine_lost(self_ptr self, engine_role role, uint32_t index,
                 const std::string& why) {
  auto& s = self->state;
  if (role == engine_role::prefill) {
    if (!s.pe_lost[index])
      ++s.lost_engines;
    s.pe_lost[index] = true;
    s.pe_actor[index] = nullptr;
    s.all_pes.erase(std::remove(s.all_pes.begin(), s.all_pes.end(), index),
                    s.all_pes.end());
  } else {
    if (!s.de_lost[index])
      ++s.lost_engines;
    s.de_lost[index] = true;
    s.de_actor[index] = nullptr;
    s.st.decode[index].free_hbm_bytes = 0;
  }
  auto& eid = role == engine_role::prefill ? s.cfg.prefill[index].id
                                           : s.cfg.decode[index].id;
  auto name = eid.node + "/" + to_string(role) + std::to_string(eid.rank);
  for (auto& [id, t] : s.requests) {
    if (!t.dispatched)
      continue;
    bool hit = role == engine_role::prefill ? t.decision.prefill == index
                                            : t.decode == index;
    if (hit)
      requeue(self, t, name + " lost: " + why);
  }
  drain_lost(self);
  emit_event(self, "engine_down", 0, name + ": " + why);
}

} // namespace

caf::expected<scheduler_actor> spawn_scheduler(caf::actor_system& sys,
                                               scheduler_config cfg) {
  // The policies' view of one role's engines: index, group and node.
  auto states_of = [](const auto& engines) {
    std::vector<scheduler::engine_state> out;
    for (uint32_t i = 0; i < engines.size(); ++i) {
      scheduler::engine_state e;
      e.id = i;
      e.group = engines[i].group;
      e.node = engines[i].node;
      out.push_back(e);
    }
    return out;
  };
  auto pe = states_of(cfg.prefill);
  auto de = states_of(cfg.decode);
  if (pe.empty() || de.empty())
    return caf::make_error(caf::sec::invalid_argument,
                           "scheduler needs at least one prefill and one "
                           "decode engine");
  auto st =
      scheduler::cluster_state::make(std::move(pe), std::move(de), cfg.nodes);
  if (!st)
    return caf::make_error(caf::sec::invalid_argument,
                           "scheduler cluster description: "
                               + caf::to_string(st.error()));
  auto hdl = sys.spawn([cfg = std::move(cfg),
                        st = std::move(*st)](self_ptr self) mutable
                       -> scheduler_actor::behavior_type {
    auto& s = self->state;
    s.cfg = std::move(cfg);
    s.st = std::move(st);
    s.policy = scheduler::make_policy(s.cfg.policy);
    s.pe_actor.resize(s.cfg.prefill.size());
    s.de_actor.resize(s.cfg.decode.size());
    s.pe_lost.resize(s.cfg.prefill.size(), false);
    s.de_lost.resize(s.cfg.decode.size(), false);
    s.de_seq.resize(s.cfg.decode.size(), 0);
    s.de_tok.resize(s.cfg.decode.size(), 0);
    for (uint32_t i = 0; i < s.cfg.prefill.size(); ++i) {
      s.pe_index.add(s.cfg.prefill[i].id, i);
      s.all_pes.push_back(i);
      auto g = s.cfg.prefill[i].group;
      if (s.pe_groups.size() <= g)
        s.pe_groups.resize(g + 1);
      s.pe_groups[g].push_back(i);
    }
    for (uint32_t i = 0; i < s.cfg.decode.size(); ++i)
      s.de_index.add(s.cfg.decode[i].id, i);
    self->set_down_handler([self](const caf::down_msg& dm) {
      // An engine died (or its node was lost: a remote node's actors go
      // down with remote_link_unreachable): re-queue every request it held
      // and stop choosing it until it enrolls again.
      auto& s = self->state;
      for (uint32_t i = 0; i < s.pe_actor.size(); ++i)
        if (s.pe_actor[i] && s.pe_actor[i].address() == dm.source)
          engine_lost(self, engine_role::prefill, i, to_string(dm.reason));
      for (uint32_t i = 0; i < s.de_actor.size(); ++i)
        if (s.de_actor[i] && s.de_actor[i].address() == dm.source)
          engine_lost(self, engine_role::decode, i, to_string(dm.reason));
    });
    return {
        [self](submit_atom, request_spec& spec) -> caf::result<request_result> {
          auto& s = self->state;
          if (s.requests.count(spec.id) != 0)
            return caf::make_error(caf::sec::invalid_argument,
                                   "duplicate request id "
                                       + std::to_string(spec.id));
          scheduler::request_info info;
          info.id = spec.id;
          info.prompt_tokens = static_cast<uint32_t>(spec.tokens.size());
          info.gen_tokens = spec.gen_tokens;
          info.kv_bytes_per_token =
              static_cast<uint32_t>(s.cfg.kv_bytes_per_token);
          if (s.cfg.store) {
            auto bt = s.cfg.store->geometry().block_tokens;
            auto hashes = spec.tokens.block_hash_span(bt);
            info.hit_blocks =
                static_cast<uint32_t>(known_hits(s, spec.agent, hashes));
            info.hit_tokens = info.hit_blocks * bt;
          }
          auto promise = self->make_response_promise<request_result>();
          tracked_request t;
          t.spec = std::move(spec);
          t.info = info;
          t.promise = promise;
          s.requests.emplace(info.id, std::move(t));
          s.waiting.push_back(info);
          ++s.counters.submitted;
          if (s.cfg.hooks)
            s.cfg.hooks->count("dualpath_requests_submitted_total", {});
          return promise;
        },
        [self](fetch_atom, const group_report& rep) -> work_batch {
          auto& s = self->state;
          ++s.counters.fetches;
          for (auto& e : rep.engines) {
            if (auto i = s.pe_index.find(e.engine))
              s.st.update_prefill(*i, e.seq, e.tok, e.read_q_tokens);
            observe_load(s, e);
          }
          if (rep.group >= s.pe_groups.size() || s.waiting.empty()) {
            ++s.counters.empty_fetches;
            return {};
          }
          // Candidates: every prefill engine, not only the fetching group's.
          // With the group's engines alone, the first leader to fetch takes
          // up to beta tokens per engine of the whole queue while the other
          // groups idle (measured: half the prefill GPUs unused at 2P4D);
          // assignments for other groups are pushed to their engines.
          if (s.all_pes.empty()) {
            ++s.counters.empty_fetches;
            return {};
          }
          auto res = s.policy->fetch(s.st, s.waiting, s.all_pes);
          auto batch = apply(self, res, rep.group);
          drain_lost(self);
          if (batch.items.empty())
            ++s.counters.empty_fetches;
          return batch;
        },
        [self](report_atom, const group_report& rep) {
          auto& s = self->state;
          for (auto& e : rep.engines) {
            // seq_e / tok_e: what was dispatched there and is not done (see
            // de_tok); the engine reports its read queue and free HBM.
            if (auto i = s.de_index.find(e.engine))
              s.st.update_decode(*i, s.de_seq[*i], s.de_tok[*i],
                                 e.read_q_tokens, e.free_hbm_bytes);
            observe_load(s, e);
          }
          if (rep.group < s.st.decode_groups.size()) {
            scheduler::fetch_result res;
            res.placed = s.policy->place(s.st, rep.group);
            apply(self, res, -1);
          }
        },
        [self](enroll_atom, const engine_registration& reg) -> bool {
          auto& s = self->state;
          auto& index =
              reg.engine.role == engine_role::prefill ? s.pe_index : s.de_index;
          auto& actors =
              reg.engine.role == engine_role::prefill ? s.pe_actor : s.de_actor;
          auto found = index.find(reg.engine);
          if (!found || !reg.handle)
            return false;
          auto k = *found;
          actors[k] = reg.handle;
          self->monitor(reg.handle);
          // A lost engine that comes back (its node restarted) is used again.
          if (reg.engine.role == engine_role::prefill) {
            if (s.pe_lost[k]) {
              s.pe_lost[k] = false;
              --s.lost_engines;
              s.all_pes.push_back(k);
              std::sort(s.all_pes.begin(), s.all_pes.end());
            }
          } else if (s.de_lost[k]) {
            s.de_lost[k] = false;
            --s.lost_engines;
            auto g = s.cfg.decode[k].group;
            auto& grp = s.st.decode_groups[g];
            uint64_t total = 0;
            for (auto m : grp.members)
              if (!s.de_lost[m])
                total += s.st.decode[m].tok;
            for (auto& r : grp.pending)
              total += r.prompt_tokens;
            grp.total_tokens = total;
          }
          // A decode engine's KV budget counts from now (with nothing
          // dispatched there; otherwise its reports keep it) and its
          // group's pending requests may go there at once.
          if (reg.engine.role == engine_role::decode && s.de_seq[k] == 0) {
            s.st.decode[k].free_hbm_bytes = reg.free_hbm_bytes;
            scheduler::fetch_result res;
            res.placed = s.policy->place(s.st, s.cfg.decode[k].group);
            apply(self, res, -1);
          }
          emit_event(self, "engine_enrolled", 0, reg.engine.node);
          return true;
        },
        [self](fail_atom, const request_failure& f) {
          auto& s = self->state;
          auto attempt = static_cast<uint32_t>(f.id >> attempt_shift);
          auto i = s.requests.find(f.id & id_mask);
          auto why = f.engine.node + "/" + to_string(f.engine.role)
                     + std::to_string(f.engine.rank)
                     + " failed: " + caf::to_string(f.error);
          if (i == s.requests.end() || attempt != i->second.attempt
              || !i->second.dispatched) {
            emit_event(self, "stale_failure", f.id, why);
            return;
          }
          auto& t = i->second;
          if (s.cfg.hooks)
            s.cfg.hooks->count("dualpath_errors_total",
                               {{"source", "scheduler"}, {"kind", "attempt"}});
          if (t.attempt + 1 >= max_attempts) {
            undispatch(s, t);
            emit_event(self, "request_failed", t.spec.id, why);
            t.promise.deliver(f.error);
            s.requests.erase(i);
            return;
          }
          requeue(self, t, why);
        },
        [self](done_atom, request_result& res) {
          auto& s = self->state;
          auto attempt = static_cast<uint32_t>(res.id >> attempt_shift);
          auto i = s.requests.find(res.id & id_mask);
          if (i == s.requests.end()) {
            emit_event(self, "unknown_done", res.id, "");
            return;
          }
          if (attempt != i->second.attempt) {
            // An earlier attempt finished after all: its result is not
            // counted (the current attempt's will be).
            emit_event(self, "stale_done", res.id, "");
            return;
          }
          res.id &= id_mask;
          undispatch(s, i->second);
          res.reroutes += i->second.attempt;
          ++s.counters.completed;
          observe_done(s, res);
          i->second.promise.deliver(std::move(res));
          s.requests.erase(i);
        },
    };
  });
  return hdl;
}

} // namespace dualpath::actors
