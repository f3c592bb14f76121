// The verbs backend: posting and the bookkeeping of connections (see
// verbs_backend.hpp for the design; registrations live in verbs_regions.cpp,
// the handshake in verbs_handshake.cpp, completion handling in
// verbs_completion.cpp).
//
// Resources follow rc_pingpong's order (context -> PD -> completion channel
// -> CQ -> MRs -> QPs), each held by a unique_ptr whose deleter is its ibv_*
// destroy call, and are declared so that destruction runs in reverse.
#include "transport/bulk/verbs_backend.hpp"

#include <arpa/inet.h>
#include <pthread.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <mutex>

#include "config/errors.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

namespace {

constexpr uint64_t max_wr_bytes = 1u << 30;

caf::error lost(const std::string& why) {
  return caf::make_error(transport_errc::peer_lost, why);
}

uint32_t wrs_of(const write_request& w) {
  return static_cast<uint32_t>(std::max<uint64_t>(
      1, (w.destination.length + max_wr_bytes - 1) / max_wr_bytes));
}

/// The parts of a batch too large for the send window, in order, each of at
/// most `window` work requests; the immediate goes with the last part.
caf::expected<std::vector<batch>> split_batch(batch& b, uint32_t window) {
  std::vector<batch> parts;
  uint32_t in_part = 0;
  for (auto& w : b.writes) {
    auto n = wrs_of(w);
    if (n > window)
      return caf::make_error(transport_errc::queue_full,
                             "one write of " + std::to_string(n)
                                 + " work requests exceeds "
                                   "transport.max_outstanding");
    if (parts.empty() || in_part + n > window) {
      parts.emplace_back();
      parts.back().tclass = b.tclass;
      parts.back().tag = b.tag;
      parts.back().deadline = b.deadline;
      in_part = 0;
    }
    parts.back().writes.push_back(std::move(w));
    in_part += n;
  }
  parts.back().immediate = b.immediate;
  return parts;
}

/// One completion for a split batch, after its last part: the bytes of every
/// part and the first error; delivered from whichever thread completes last.
/// The KV lanes this thread became the poster of (posted at its next
/// deliver(), outside the lock), and the lane whose thread this is.
thread_local std::vector<void*> lanes_to_post;
thread_local const void* own_lane = nullptr;

struct split_completion {
  std::mutex mtx;
  size_t left = 0;
  uint64_t tag = 0;
  uint32_t writes = 0;
  uint64_t bytes = 0;
  caf::error error;
  completion_sink sink;
};

} // namespace

caf::expected<std::unique_ptr<verbs_backend>>
verbs_backend::open(const options& opts) {
  auto dev = verbs::device::open(opts);
  if (!dev)
    return dev.error();
  if (opts.verbs_max_outstanding == 0
      || opts.verbs_max_outstanding > static_cast<uint32_t>(dev->max_qp_wr()))
    return caf::make_error(transport_errc::unsupported,
                           "transport.max_outstanding = "
                               + std::to_string(opts.verbs_max_outstanding)
                               + ": " + dev->name() + " allows 1.."
                               + std::to_string(dev->max_qp_wr()));
  std::unique_ptr<verbs_backend> b{new verbs_backend(opts, std::move(*dev))};
  if (auto err = b->start())
    return err;
  return b;
}

verbs_backend::verbs_backend(const options& opts, verbs::device dev)
    : opts_(opts), incarnation_(random_u64() | 1), dev_(std::move(dev)) {
  // nop
}

caf::error verbs_backend::start() {
  auto ch = verbs::vptr("ibv_create_comp_channel",
                        ibv_create_comp_channel(dev_.context()));
  if (!ch)
    return ch.error();
  channel_.reset(*ch);
  int initial = std::min(dev_.max_cqe(), 1024);
  auto cq =
      verbs::vptr("ibv_create_cq", ibv_create_cq(dev_.context(), initial,
                                                 nullptr, channel_.get(), 0));
  if (!cq)
    return cq.error();
  cq_.reset(*cq);
  cq_capacity_ = cq_->cqe;
  if (auto err =
          verbs::vcall("ibv_req_notify_cq", ibv_req_notify_cq(cq_.get(), 0)))
    return err;
  auto l = verbs::listener::open(opts_.listen_host, opts_.verbs_handshake_port);
  if (!l)
    return l.error();
  listener_ = std::move(*l);
  address_ = opts_.listen_host + ":" + std::to_string(listener_.port);
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (auto err = verbs::scall("eventfd", wake_fd_.get()))
    return err;
  poll_wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (auto err = verbs::scall("eventfd", poll_wake_fd_.get()))
    return err;
  for (uint32_t k = 1; k <= opts_.verbs_kv_queue_pairs; ++k) {
    auto lane = std::make_unique<kv_lane>();
    lane->owner = this;
    lane->index = k;
    auto lch = verbs::vptr("ibv_create_comp_channel",
                           ibv_create_comp_channel(dev_.context()),
                           "KV lane " + std::to_string(k));
    if (!lch)
      return lch.error();
    lane->channel.reset(*lch);
    auto lcq = verbs::vptr(
        "ibv_create_cq",
        ibv_create_cq(dev_.context(), initial, nullptr, lane->channel.get(), 0),
        "KV lane " + std::to_string(k));
    if (!lcq)
      return lcq.error();
    lane->cq.reset(*lcq);
    lane->cq_capacity = lane->cq->cqe;
    lane->wake_fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (auto err = verbs::scall("eventfd", lane->wake_fd.get()))
      return err;
    kv_lanes_.push_back(std::move(lane));
  }
  poller_ = std::thread{[this] { poll_loop(); }};
  for (auto& lane : kv_lanes_) {
    auto* l = lane.get();
    l->thread = std::thread{[this, l] { lane_loop(*l); }};
    auto name = "dp-verbs-kv" + std::to_string(l->index);
    static_cast<void>(
        ::pthread_setname_np(l->thread.native_handle(), name.c_str()));
  }
  side_ = std::thread{[this] { side_loop(); }};
  connector_ = std::thread{[this] { connector_loop(); }};
  // Names for top -H, perf and the tests (at most 15 characters, which
  // these are: pthread_setname_np cannot fail for them).
  static_cast<void>(
      ::pthread_setname_np(poller_.native_handle(), "dp-verbs-cq"));
  static_cast<void>(
      ::pthread_setname_np(side_.native_handle(), "dp-verbs-side"));
  static_cast<void>(
      ::pthread_setname_np(connector_.native_handle(), "dp-verbs-conn"));
  return caf::none;
}

verbs_backend::~verbs_backend() {
  // Stop the handshake threads first (no new connections), then fail what
  // is pending and tear every queue pair down, then stop the poller; the
  // members go in reverse order of acquisition (MRs, CQ, channel, device).
  {
    std::lock_guard<std::mutex> guard{mtx_};
    stop_ = true;
  }
  cv_.notify_all();
  jobs_cv_.notify_all();
  wake();
  if (connector_.joinable())
    connector_.join();
  if (side_.joinable())
    side_.join();
  done_list done;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& [name, o] : out_)
      break_outgoing(o, transport_errc::peer_lost, "verbs backend shut down",
                     done);
    for (auto& [id, pb] : batches_)
      if (pb.state != batch_state::expired)
        done.emplace_back(std::move(pb.sink),
                          completion{pb.b.tag, 0,
                                     static_cast<uint32_t>(pb.b.writes.size()),
                                     lost("verbs backend shut down")});
    batches_.clear();
    out_.clear();
    in_.clear();
  }
  wake_poller();
  if (poller_.joinable())
    poller_.join();
  for (auto& lane : kv_lanes_) {
    uint64_t one = 1;
    static_cast<void>(::write(lane->wake_fd.get(), &one, sizeof(one)));
    if (lane->thread.joinable())
      lane->thread.join();
    lane->chains.clear(); // the last references to torn-down queue pairs
  }
  deliver(done);
  std::lock_guard<std::mutex> guard{mtx_};
  mrs_.clear();
}

capabilities verbs_backend::caps() const {
  capabilities c;
  c.name = "verbs";
  c.immediate = true;
  c.device_memory = true;
  c.cross_process = true;
  return c;
}

void verbs_backend::fail_unposted(const batch& b, completion_sink& sink,
                                  caf::error err) {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    ++stats_.batches_posted;
    ++stats_.batches_failed;
    if (err.code() == static_cast<uint8_t>(transport_errc::peer_lost))
      ++stats_.peer_lost;
  }
  if (sink)
    sink(completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                    std::move(err)});
}

void verbs_backend::post(batch b, completion_sink sink) {
  post_defaults(b, opts_);
  if (auto err = validate(b))
    return fail_unposted(b, sink, std::move(err));
  uint32_t wrs = 0;
  uint64_t bytes = 0;
  for (auto& w : b.writes) {
    wrs += wrs_of(w);
    bytes += w.destination.length;
  }
  if (wrs > opts_.verbs_max_outstanding) {
    // Larger than the send window: posted as consecutive parts that fit it,
    // queued in order on the same class (one queue pair, written in order),
    // with one completion for the whole after the last part.
    const auto writes = static_cast<uint32_t>(b.writes.size());
    const auto tag = b.tag;
    auto parts = split_batch(b, opts_.verbs_max_outstanding);
    if (!parts)
      return fail_unposted(b, sink, std::move(parts.error()));
    auto sum = std::make_shared<split_completion>();
    sum->left = parts->size();
    sum->tag = tag;
    sum->writes = writes;
    sum->sink = std::move(sink);
    for (auto& part : *parts) {
      uint32_t part_wrs = 0;
      uint64_t part_bytes = 0;
      for (auto& w : part.writes) {
        part_wrs += wrs_of(w);
        part_bytes += w.destination.length;
      }
      // Pinned to the class's first lane: the parts land in order, the
      // immediate (with the last) after all of them.
      enqueue(
          std::move(part),
          [sum](completion c) {
            completion whole;
            {
              std::lock_guard<std::mutex> guard{sum->mtx};
              sum->bytes += c.bytes;
              if (c.error && !sum->error)
                sum->error = std::move(c.error);
              if (--sum->left > 0)
                return;
              whole.tag = sum->tag;
              whole.bytes = sum->bytes;
              whole.failed_ops = sum->error ? sum->writes : 0;
              whole.error = std::move(sum->error);
            }
            if (sum->sink)
              sum->sink(std::move(whole));
          },
          part_wrs, part_bytes, true);
    }
    return;
  }
  enqueue(std::move(b), std::move(sink), wrs, bytes, false);
}

void verbs_backend::enqueue(batch b, completion_sink sink, uint32_t wrs,
                            uint64_t bytes, bool pinned) {
  done_list done;
  std::unique_lock<std::mutex> guard{mtx_};
  const auto& peer = b.writes.front().destination.node;
  std::vector<uint32_t> sources;
  for (auto& w : b.writes) {
    auto m = mrs_.find(w.source->id());
    if (m == mrs_.end() || m->second.removing
        || m->second.mr->lkey != w.source->lkey)
      return guard.unlock(),
             fail_unposted(b, sink,
                           caf::make_error(transport_errc::unknown_region,
                                           "source not registered with this "
                                           "verbs backend"));
    if (std::find(sources.begin(), sources.end(), w.source->id())
        == sources.end())
      sources.push_back(w.source->id());
  }
  auto oi = out_.find(peer);
  if (oi == out_.end())
    return guard.unlock(),
           fail_unposted(b, sink, lost("not connected to " + peer));
  auto& o = oi->second;
  if (o.state == link_state::failed && clock_type::now() < o.retry_at)
    return guard.unlock(),
           fail_unposted(
               b, sink,
               lost("no verbs connection to " + peer + " ("
                    + (o.last_error ? to_string(
                           static_cast<transport_errc>(o.last_error.code()))
                                    : std::string{"failed"})
                    + "; retrying shortly)"));
  if (o.batches >= opts_.max_pending_batches)
    return guard.unlock(),
           fail_unposted(
               b, sink,
               caf::make_error(transport_errc::queue_full,
                               "more than "
                                   + std::to_string(opts_.max_pending_batches)
                                   + " batches pending for " + peer));
  ++stats_.batches_posted;
  auto id = next_batch_++;
  auto& pb = batches_[id];
  pb.id = id;
  pb.b = std::move(b);
  pb.sink = std::move(sink);
  pb.peer = peer;
  pb.wrs = wrs;
  pb.bytes = bytes;
  pb.pinned = pinned;
  pb.sources = std::move(sources);
  pb.need_fetch = o.fetches + 1;
  for (auto s : pb.sources)
    ++mrs_[s].uses;
  ++o.batches;
  // The poller sleeps until the earliest deadline it knows: an earlier one
  // wakes it (the first batch after an idle spell; rarely any other).
  bool earlier = false;
  if (auto at = pb.b.deadline.time_since_epoch().count();
      at < next_deadline_scan_.load()) {
    next_deadline_scan_ = at;
    earlier = true;
  }
  if (o.state == link_state::connected) {
    admit(o, pb, done);
  } else {
    o.parked.push_back(id);
    if (o.state != link_state::connecting)
      start_attempt(o);
  }
  guard.unlock();
  if (earlier)
    wake_poller();
  deliver(done);
}

void verbs_backend::admit(outgoing& o, pending& pb, done_list& done) {
  pb.targets.clear();
  for (auto& w : pb.b.writes) {
    const auto& d = w.destination;
    auto e = o.table.find(d.region_id);
    if (e == o.table.end()) {
      if (o.table_fetch >= pb.need_fetch) {
        ++stats_.rejected_unknown_region;
        return fail(pb, transport_errc::unknown_region,
                    o.peer + " has no region " + std::to_string(d.region_id),
                    done);
      }
      pb.state = batch_state::parked;
      o.parked.push_back(pb.id);
      return request_table(o);
    }
    if (e->second.key != d.key) {
      ++stats_.rejected_wrong_key;
      return fail(pb, transport_errc::wrong_key,
                  "wrong key for region " + std::to_string(d.region_id) + " of "
                      + o.peer,
                  done);
    }
    if (d.offset > e->second.length || d.length > e->second.length - d.offset) {
      ++stats_.rejected_out_of_bounds;
      return fail(pb, transport_errc::out_of_bounds,
                  "write of " + std::to_string(d.length) + " bytes at "
                      + std::to_string(d.offset) + " outside region "
                      + std::to_string(d.region_id) + " of " + o.peer + " ("
                      + std::to_string(e->second.length) + " bytes)",
                  done);
    }
    pb.targets.emplace_back(e->second.base + d.offset, e->second.rkey);
  }
  pb.state = batch_state::queued;
  auto c = static_cast<size_t>(pb.b.tclass);
  o.queued[c].push_back(pb.id);
  pump(o, c, done);
}

void verbs_backend::request_table(outgoing& o) {
  if (o.fetch_in_flight)
    return;
  o.fetch_in_flight = true;
  ++o.fetches;
  side_command c;
  c.kind = side_command::send;
  c.conn = o.conn;
  c.type = verbs::frame_type::regions_req;
  command_side(std::move(c));
  wake();
}

size_t verbs_backend::pick_lane(const outgoing& o, size_t c,
                                const pending& pb) const {
  auto fits = [&](size_t l) {
    return o.outstanding[l] + pb.wrs <= opts_.verbs_max_outstanding;
  };
  if (c == static_cast<size_t>(traffic_class::control) || pb.pinned) {
    size_t first = c == static_cast<size_t>(traffic_class::control) ? 0 : 1;
    return first < o.lanes && fits(first) ? first : verbs::max_lanes;
  }
  // A lane's thread (a completion callback posting again) refills its own
  // lane while it has room: that lane's protocol work stays on its core.
  if (own_lane != nullptr) {
    auto* mine = static_cast<const kv_lane*>(own_lane);
    if (mine->owner == this && mine->index < o.lanes && fits(mine->index))
      return mine->index;
  }
  // The fewest outstanding work requests; among equals the next in turn
  // (a caller that posts itself often finds every lane empty again).
  size_t best = verbs::max_lanes;
  const size_t kv = o.lanes - 1;
  for (size_t k = 0; k < kv; ++k) {
    size_t l = 1 + (o.next_kv - 1 + k) % kv;
    if (fits(l)
        && (best == verbs::max_lanes || o.outstanding[l] < o.outstanding[best]))
      best = l;
  }
  return best;
}

void verbs_backend::pump(outgoing& o, size_t c, done_list& done) {
  while (!o.queued[c].empty() && o.state == link_state::connected) {
    auto& pb = batches_.at(o.queued[c].front());
    auto lane = pick_lane(o, c, pb);
    if (lane == verbs::max_lanes)
      break;
    o.queued[c].pop_front();
    staged st;
    st.qp = o.qps[lane];
    st.conn = o.conn;
    st.sges.reserve(pb.wrs);
    st.wrs.reserve(pb.wrs);
    for (size_t k = 0; k < pb.b.writes.size(); ++k) {
      auto& w = pb.b.writes[k];
      uint64_t off = 0;
      do {
        auto n = std::min(max_wr_bytes, w.destination.length - off);
        ibv_sge sge{};
        sge.addr = reinterpret_cast<uint64_t>(w.source->data())
                   + w.source_offset + off;
        sge.length = static_cast<uint32_t>(n);
        sge.lkey = w.source->lkey;
        st.sges.push_back(sge);
        ibv_send_wr wr{};
        wr.wr_id = pb.id;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = pb.targets[k].first + off;
        wr.wr.rdma.rkey = pb.targets[k].second;
        st.wrs.push_back(wr);
        off += n;
      } while (off < w.destination.length);
    }
    for (size_t k = 0; k < st.wrs.size(); ++k) {
      st.wrs[k].sg_list = &st.sges[k];
      st.wrs[k].num_sge = st.sges[k].length > 0 ? 1 : 0;
      st.wrs[k].next = k + 1 < st.wrs.size() ? &st.wrs[k + 1] : nullptr;
    }
    // Selective signalling: at most the last work request is signalled (RC
    // completes in order, so one completion retires everything before it
    // on the same queue pair). A KV batch signals when nothing signalled is
    // on the wire ahead of it on its lane, every signal_every batches, or
    // when half the send queue would be unsignalled; when a completion
    // leaves unsignalled batches with no signal behind them, a zero-length
    // fence write is signalled for them.
    auto& last = st.wrs.back();
    bool signal =
        c == static_cast<size_t>(traffic_class::control)
        || o.signaled[lane] == 0 || o.quiet[lane] + 1 >= signal_every
        || 2 * (o.quiet_wrs[lane] + pb.wrs) > opts_.verbs_max_outstanding;
    if (signal) {
      last.send_flags = IBV_SEND_SIGNALED;
      ++o.signaled[lane];
      o.quiet[lane] = o.quiet_wrs[lane] = 0;
    } else {
      ++o.quiet[lane];
      o.quiet_wrs[lane] += pb.wrs;
    }
    o.wire[lane].push_back(pb.id);
    o.last_target[lane] = pb.targets.front();
    if (pb.b.immediate) {
      last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      last.imm_data = htonl(*pb.b.immediate);
    }
    pb.state = batch_state::posted;
    pb.conn = o.conn;
    pb.lane = static_cast<uint8_t>(lane);
    if (lane > 0)
      o.next_kv = 1 + lane % (o.lanes - 1);
    if (lane == 0)
      ++inflight_;
    else
      ++kv_lanes_[lane - 1]->inflight;
    o.outstanding[lane] += pb.wrs;
    stats_.bytes_sent[c] += pb.bytes;
    lane_bytes_[lane] += pb.bytes;
    submit(o, lane, std::move(st), done);
  }
}

void verbs_backend::submit(outgoing& o, size_t lane, staged st,
                           done_list& done) {
  if (lane > 0) {
    auto& kl = *kv_lanes_[lane - 1];
    std::lock_guard<std::mutex> guard{kl.mtx};
    kl.chains.push_back(std::move(st));
    if (!kl.posting && !kl.awake) {
      kl.posting = true;
      lanes_to_post.push_back(&kl);
    }
    return;
  }
  ibv_send_wr* bad = nullptr;
  if (auto err = verbs::vcall("ibv_post_send",
                              ibv_post_send(st.qp->get(), st.wrs.data(), &bad),
                              "to " + o.peer))
    // Some of the chain may be on the queue pair already: only stopping
    // the queue pair makes sure none of it still reads the source. Every
    // batch of the connection fails with it.
    break_outgoing(o, transport_errc::peer_lost,
                   "ibv_post_send to " + o.peer
                       + " failed: " + config::message_of(err),
                   done);
}

void verbs_backend::fail(pending& pb, transport_errc code, std::string why,
                         done_list& done) {
  fail(pb, caf::make_error(code, std::move(why)), done);
}

void verbs_backend::fail(pending& pb, caf::error err, done_list& done) {
  if (pb.state != batch_state::expired)
    done.emplace_back(std::move(pb.sink),
                      completion{pb.b.tag, 0,
                                 static_cast<uint32_t>(pb.b.writes.size()),
                                 std::move(err)});
  release(pb.id);
}

void verbs_backend::release(uint64_t id) {
  auto i = batches_.find(id);
  if (i == batches_.end())
    return;
  if (i->second.state == batch_state::posted
      || i->second.state == batch_state::expired) {
    if (i->second.lane == 0)
      --inflight_;
    else
      --kv_lanes_[i->second.lane - 1]->inflight;
  }
  // Only a deregistration waiting for its region's last use is woken: a
  // notification per batch would wake every waiter on cv_ per completion.
  bool drained = false;
  for (auto s : i->second.sources) {
    auto m = mrs_.find(s);
    if (m != mrs_.end() && m->second.uses > 0 && --m->second.uses == 0
        && m->second.removing)
      drained = true;
  }
  auto o = out_.find(i->second.peer);
  if (o != out_.end() && o->second.batches > 0)
    --o->second.batches;
  batches_.erase(i);
  if (drained)
    cv_.notify_all();
}

void verbs_backend::break_outgoing(outgoing& o, transport_errc code,
                                   const std::string& why, done_list& done) {
  if (o.state == link_state::connected) {
    for (size_t l = 0; l < o.lanes; ++l)
      if (o.qps[l])
        o.qps[l]->to_error();
    side_command c;
    c.kind = side_command::close;
    c.conn = o.conn;
    command_side(std::move(c));
  }
  // Every batch of this peer fails now: queued and parked ones were never
  // posted; posted ones are stopped by destroying the queue pairs below.
  std::vector<uint64_t> ids;
  for (auto& [id, pb] : batches_)
    if (pb.peer == o.peer
        && (pb.state == batch_state::parked || pb.state == batch_state::queued
            || pb.conn == o.conn))
      ids.push_back(id);
  for (auto id : ids) {
    auto& pb = batches_.at(id);
    if (code == transport_errc::peer_lost && pb.state != batch_state::expired)
      ++stats_.peer_lost;
    fail(pb, code, why, done);
  }
  if (o.state == link_state::connected) {
    // A KV lane's thread may still hold one to post a staged chain: that
    // post meets a queue pair in ERR (flushed, nothing read) and the last
    // reference destroys it.
    for (auto& q : o.qps)
      q.reset();
    o.lanes = 0;
    unreserve_outgoing();
  }
  for (auto& q : o.queued)
    q.clear();
  o.parked.clear();
  for (size_t l = 0; l < verbs::max_lanes; ++l) {
    o.outstanding[l] = o.signaled[l] = o.quiet[l] = o.quiet_wrs[l] = 0;
    o.wire[l].clear();
  }
  o.table.clear();
  o.fetch_in_flight = false;
  if (o.state != link_state::connecting)
    o.state = link_state::idle;
  o.conn = 0;
  wake();
}

void verbs_backend::command_side(side_command c) {
  std::lock_guard<std::mutex> guard{commands_mtx_};
  commands_.push_back(std::move(c));
}

void verbs_backend::wake() {
  uint64_t one = 1;
  // A full eventfd counter still wakes the reader: nothing to handle.
  static_cast<void>(verbs::scall("write(eventfd)",
                                 ::write(wake_fd_.get(), &one, sizeof(one))));
}

void verbs_backend::wake_poller() {
  uint64_t one = 1;
  static_cast<void>(verbs::scall(
      "write(eventfd)", ::write(poll_wake_fd_.get(), &one, sizeof(one))));
}

void verbs_backend::drop_incoming(uint64_t conn) {
  auto i = in_.find(conn);
  if (i == in_.end())
    return;
  cq_used_ -=
      static_cast<int>(i->second.lanes) * static_cast<int>(recv_depth + 1);
  in_.erase(i);   // destroys the queue pairs
  side_command c; // the sender learns it from its side channel's end
  c.kind = side_command::close;
  c.conn = conn;
  command_side(std::move(c));
  wake();
}

caf::error verbs_backend::grow_cq(int entries) {
  int need = cq_used_ + entries;
  if (need > dev_.max_cqe())
    return caf::make_error(
        transport_errc::queue_full,
        "the completion queue would need " + std::to_string(need) + " entries, "
            + dev_.name() + " allows " + std::to_string(dev_.max_cqe())
            + " (lower transport.max_outstanding or the "
              "number of peers)");
  if (need > cq_capacity_) {
    int want =
        std::min(dev_.max_cqe(), std::max(need + need / 4, 2 * cq_capacity_));
    std::lock_guard<std::mutex> guard{cq_mtx_};
    if (auto err = verbs::vcall("ibv_resize_cq", ibv_resize_cq(cq_.get(), want),
                                std::to_string(want) + " entries"))
      return err;
    cq_capacity_ = cq_->cqe;
  }
  cq_used_ = need;
  return caf::none;
}

caf::error verbs_backend::reserve_outgoing() {
  const int sends = static_cast<int>(opts_.verbs_max_outstanding + 1);
  if (auto err = grow_cq(sends + static_cast<int>(kv_lanes_.size())))
    return err;
  size_t k = 0;
  caf::error err;
  for (; k < kv_lanes_.size() && !err; ++k) {
    auto& l = *kv_lanes_[k];
    int need = l.cq_used + sends;
    if (need > dev_.max_cqe()) {
      err = caf::make_error(
          transport_errc::queue_full,
          "KV lane " + std::to_string(l.index) + "'s completion queue would "
              + "need " + std::to_string(need) + " entries, " + dev_.name()
              + " allows " + std::to_string(dev_.max_cqe())
              + " (lower transport.max_outstanding or the number of peers)");
      break;
    }
    if (need > l.cq_capacity) {
      int want = std::min(dev_.max_cqe(),
                          std::max(need + need / 4, 2 * l.cq_capacity));
      std::lock_guard<std::mutex> guard{l.cq_mtx};
      if ((err = verbs::vcall("ibv_resize_cq", ibv_resize_cq(l.cq.get(), want),
                              std::to_string(want) + " entries")))
        break;
      l.cq_capacity = l.cq->cqe;
    }
    l.cq_used = need;
  }
  if (err) {
    for (size_t j = 0; j < k; ++j)
      kv_lanes_[j]->cq_used -= sends;
    cq_used_ -= sends + static_cast<int>(kv_lanes_.size());
  }
  return err;
}

void verbs_backend::unreserve_outgoing() {
  const int sends = static_cast<int>(opts_.verbs_max_outstanding + 1);
  cq_used_ -= sends + static_cast<int>(kv_lanes_.size());
  for (auto& l : kv_lanes_)
    l->cq_used -= sends;
}

verbs_backend::outgoing* verbs_backend::find_conn(uint64_t conn) {
  for (auto& [name, o] : out_)
    if (o.conn == conn && o.state == link_state::connected)
      return &o;
  return nullptr;
}

void verbs_backend::set_own_lane(const kv_lane* lane) {
  own_lane = lane;
}

void verbs_backend::post_lanes() {
  // This thread's lanes of this backend (another backend's stay for its
  // own deliver(), which follows the submit() that put them here).
  std::vector<kv_lane*> mine;
  for (auto i = lanes_to_post.begin(); i != lanes_to_post.end();) {
    auto* l = static_cast<kv_lane*>(*i);
    if (l->owner == this) {
      mine.push_back(l);
      i = lanes_to_post.erase(i);
    } else {
      ++i;
    }
  }
  for (auto* l : mine)
    post_lane(*l);
}

void verbs_backend::post_lane(kv_lane& l) {
  for (;;) {
    std::deque<staged> work;
    {
      std::lock_guard<std::mutex> guard{l.mtx};
      if (l.chains.empty()) {
        l.posting = false;
        return;
      }
      work.swap(l.chains);
    }
    std::vector<std::pair<uint64_t, caf::error>> failed;
    for (auto& st : work) {
      ibv_send_wr* bad = nullptr;
      if (auto err = verbs::vcall(
              "ibv_post_send", ibv_post_send(st.qp->get(), st.wrs.data(), &bad),
              "KV lane " + std::to_string(l.index)))
        failed.emplace_back(st.conn, std::move(err));
    }
    work.clear(); // a torn-down connection's queue pair may end here
    if (failed.empty())
      continue;
    done_list done;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      for (auto& [conn, err] : failed)
        if (auto* o = find_conn(conn))
          // Part of a chain may be on the queue pair: stop it (all of the
          // connection's batches fail with it).
          break_outgoing(*o, transport_errc::peer_lost,
                         "ibv_post_send to " + o->peer
                             + " failed: " + config::message_of(err),
                         done);
    }
    deliver(done);
  }
}

void verbs_backend::deliver(done_list& done) {
  post_lanes();
  for (auto& [sink, res] : done) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (res.error) {
        ++stats_.batches_failed;
        if (res.error.code()
            == static_cast<uint8_t>(transport_errc::deadline_exceeded))
          ++stats_.deadline_exceeded;
      } else {
        ++stats_.batches_completed;
      }
    }
    if (sink)
      sink(std::move(res));
  }
  done.clear();
}

void verbs_backend::on_immediate(immediate_handler f) {
  std::lock_guard<std::mutex> guard{handler_mtx_};
  handler_ = std::move(f);
}

std::vector<uint64_t> verbs_backend::kv_lane_bytes() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return {lane_bytes_ + 1, lane_bytes_ + 1 + kv_lanes_.size()};
}

counters verbs_backend::stats() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return stats_;
}

void verbs_backend::drop_peer(const std::string& peer) {
  done_list done;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = out_.find(peer);
    if (i != out_.end()) {
      break_outgoing(i->second, transport_errc::peer_lost, "dropped " + peer,
                     done);
      // Forgets the address (connect() again to reach it); a handshake in
      // flight finds no entry when it ends and is discarded, and a
      // connect() waiting for it returns.
      out_.erase(i);
      cv_.notify_all();
    }
    std::vector<uint64_t> gone;
    for (auto& [conn, in] : in_)
      if (in.peer == peer)
        gone.push_back(conn);
    for (auto conn : gone)
      drop_incoming(conn);
  }
  wake();
  deliver(done);
}

} // namespace dualpath::transport::bulk

// make_verbs_backend: see backend.hpp.
namespace dualpath::transport::bulk {

caf::expected<std::unique_ptr<backend>>
make_verbs_backend(const options& opts) {
  auto b = verbs_backend::open(opts);
  if (!b)
    return b.error();
  return std::unique_ptr<backend>{std::move(*b)};
}

} // namespace dualpath::transport::bulk
