// The verbs backend's poller thread: work completions (batches done or
// failed, WRITE_WITH_IMM notices received), deadlines and asynchronous
// device events (see verbs_backend.hpp).
//
// Work request ids: a batch's id for its send work requests; receive work
// requests carry recv_bit | the receiving connection's id, so a completion
// never has to be matched by queue pair number (numbers are reused after a
// queue pair is destroyed; ids never are).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <thread>

#include "config/errors.hpp"
#include "transport/bulk/verbs_backend.hpp"

namespace dualpath::transport::bulk {

namespace {

constexpr uint64_t recv_bit = uint64_t{1} << 63;
// Fences: fence_bit | lane << lane_shift | the connection's id (ids stay
// far below 2^56).
constexpr uint64_t fence_bit = uint64_t{1} << 62;
constexpr int lane_shift = 56;
constexpr uint64_t conn_mask = (uint64_t{1} << lane_shift) - 1;
constexpr int poll_batch = 64;
/// A spinning poller looks at its clock, channel and deadlines this often.
constexpr uint64_t check_every = 64;
/// The longest the poller sleeps without an event or a deadline.
constexpr std::chrono::milliseconds max_sleep{1000};

transport_errc code_of(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_REM_ACCESS_ERR:
      return transport_errc::wrong_key;
    case IBV_WC_REM_INV_REQ_ERR:
      return transport_errc::out_of_bounds;
    // The queue pair could not carry the write: our RC writes name only
    // registered memory and an opcode RC supports, so what breaks is the
    // path (rxe reports a send its netdev refused, the link down, so).
    case IBV_WC_LOC_QP_OP_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
      return transport_errc::peer_lost;
    default:
      return transport_errc::system_error;
  }
}

} // namespace

caf::error verbs_backend::post_recv(ibv_qp* qp, uint64_t conn) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = recv_bit | conn;
  wr.sg_list = nullptr;
  wr.num_sge = 0; // WRITE_WITH_IMM carries no payload into the receive
  return verbs::vcall("ibv_post_recv", ibv_post_recv(qp, &wr, &bad));
}

void verbs_backend::poll_loop() {
  auto* ctx = dev_.context();
  for (int fd : {channel_->fd, ctx->async_fd}) {
    int flags = ::fcntl(fd, F_GETFL);
    if (verbs::scall("fcntl(F_GETFL)", flags)
        || verbs::scall("fcntl(F_SETFL)",
                        ::fcntl(fd, F_SETFL, flags | O_NONBLOCK)))
      break; // poll() below still guards the blocking calls
  }
  // While batches are on the wire and completions keep coming (within
  // spin_window), the poller spins on the CQ (as perftest does) instead of
  // sleeping on the completion channel: each sleep costs a wake-up and two
  // system calls per completion. Otherwise it sleeps on the channel, the
  // async events and its eventfd until the next deadline (max_sleep at
  // most): an idle backend does not wake up. A spinning round is one
  // ibv_poll_cq and nothing else: the clock, the channel, the async events
  // and the deadlines are looked at every check_every rounds (and after
  // completions), since a clock read or a system call per round costs more
  // than the poll (under emulation the clock is an emulated HPET read) and
  // takes CPU from the device's own work.
  auto last_completion = clock_type::now();
  auto now = last_completion;
  bool spin = false;
  for (uint64_t round = 0; !stop_; ++round) {
    done_list done;
    std::vector<incoming_immediate> imms;
    bool check = !spin || round % check_every == 0;
    if (check) {
      now = clock_type::now();
      spin = inflight_.load() > 0 && now - last_completion < spin_window;
      pollfd fds[3] = {{channel_->fd, POLLIN, 0},
                       {ctx->async_fd, POLLIN, 0},
                       {poll_wake_fd_.get(), POLLIN, 0}};
      int timeout = 0;
      if (!spin) {
        // Until the next deadline (a post with an earlier one wakes us), at
        // most max_sleep as a safety net: an idle backend does not tick.
        auto until = clock_type::time_point{
            clock_type::duration{next_deadline_scan_.load()}};
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now);
        timeout = static_cast<int>(
            std::clamp<int64_t>(ms.count(), 0, max_sleep.count()));
      }
      int n = ::poll(fds, 3, timeout);
      if (n > 0 && (fds[2].revents & POLLIN)) {
        uint64_t x = 0;
        static_cast<void>(::read(poll_wake_fd_.get(), &x, sizeof(x)));
      }
      if (n > 0 && (fds[0].revents & POLLIN)) {
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx) == 0) {
          ibv_ack_cq_events(ev_cq, 1);
          static_cast<void>(verbs::vcall("ibv_req_notify_cq",
                                         ibv_req_notify_cq(cq_.get(), 0)));
        }
      }
      if (n > 0 && (fds[1].revents & POLLIN)) {
        ibv_async_event ev{};
        if (ibv_get_async_event(ctx, &ev) == 0) {
          // Acknowledged before taking the lock: destroying a queue pair
          // waits for its events' acknowledgements, under the lock.
          auto copy = ev;
          ibv_ack_async_event(&ev);
          std::lock_guard<std::mutex> guard{mtx_};
          on_async_event(copy, done);
        }
      }
    }
    int got = drain(cq_.get(), cq_mtx_, 0, done, imms);
    if (got > 0 || (check && !spin))
      now = clock_type::now(); // after a sleep or the completions' work
    if (got > 0)
      last_completion = now;
    if ((check || got > 0)
        && now.time_since_epoch().count() >= next_deadline_scan_.load()) {
      std::lock_guard<std::mutex> guard{mtx_};
      check_deadlines(done);
    }
    deliver(done);
    if (!imms.empty()) {
      std::lock_guard<std::mutex> guard{handler_mtx_};
      for (auto& x : imms)
        if (handler_)
          handler_(x);
    }
    if (spin && got == 0 && check)
      std::this_thread::yield(); // to the device's work on this core
  }
}

int verbs_backend::drain(ibv_cq* cq, std::mutex& cq_mtx, size_t lane,
                         done_list& done,
                         std::vector<incoming_immediate>& imms) {
  int got = 0;
  for (;;) {
    ibv_wc wcs[poll_batch];
    int n = 0;
    {
      std::lock_guard<std::mutex> guard{cq_mtx};
      n = ibv_poll_cq(cq, poll_batch, wcs);
    }
    if (n < 0) {
      // The CQ itself failed: no completion will come for anything on it.
      auto err = verbs::vcall("ibv_poll_cq", n,
                              lane == 0 ? dev_.name()
                                        : "KV lane " + std::to_string(lane));
      std::lock_guard<std::mutex> guard{mtx_};
      for (auto& [name, o] : out_)
        break_outgoing(o, transport_errc::peer_lost, config::message_of(err),
                       done);
      return got;
    }
    if (n == 0)
      return got;
    got += n;
    std::lock_guard<std::mutex> guard{mtx_};
    for (int i = 0; i < n; ++i)
      on_completion(wcs[i], done, imms);
    if (n < poll_batch)
      return got;
  }
}

void verbs_backend::lane_loop(kv_lane& lane) {
  {
    int fd = lane.channel->fd;
    int flags = ::fcntl(fd, F_GETFL);
    if (!verbs::scall("fcntl(F_GETFL)", flags))
      static_cast<void>(verbs::scall("fcntl(F_SETFL)",
                                     ::fcntl(fd, F_SETFL, flags | O_NONBLOCK)));
  }
  set_own_lane(&lane);
  // The lane's thread posts what is queued on its lane while it is awake
  // (a thread queueing onto it while it sleeps posts itself, so a lone
  // batch is not handed over) and handles its CQ's completions (under the
  // lock, as the poller does); their callbacks may post again, which
  // refills this lane first. It spins as the poller does while work is on
  // the wire and completions keep coming, else sleeps on its completion
  // channel. Deadlines and device events stay with the poller.
  bool armed = false;
  auto last_completion = clock_type::now();
  for (uint64_t round = 1; !stop_; ++round) {
    bool post = false;
    {
      std::lock_guard<std::mutex> guard{lane.mtx};
      if (!lane.posting && !lane.chains.empty())
        post = lane.posting = true;
    }
    if (post)
      post_lane(lane);
    done_list done;
    std::vector<incoming_immediate> imms; // (none: lanes only send)
    int got = drain(lane.cq.get(), lane.cq_mtx, lane.index, done, imms);
    deliver(done);
    if (got > 0) {
      last_completion = clock_type::now();
      continue;
    }
    // Nothing completed: spin while work is on the wire and completions
    // came recently, looking at the clock only every check_every rounds;
    // otherwise arm the CQ, poll it once more, and sleep.
    if (round % check_every != 0)
      continue;
    if (lane.inflight.load() > 0
        && clock_type::now() - last_completion < spin_window) {
      std::this_thread::yield();
      continue;
    }
    if (!armed) {
      static_cast<void>(verbs::vcall("ibv_req_notify_cq",
                                     ibv_req_notify_cq(lane.cq.get(), 0)));
      armed = true;
      round = 0; // poll once more, then come back here
      continue;
    }
    {
      std::lock_guard<std::mutex> guard{lane.mtx};
      if (!lane.chains.empty())
        continue; // queued while this thread was awake: post it first
      lane.awake = false;
    }
    pollfd fds[2] = {{lane.channel->fd, POLLIN, 0},
                     {lane.wake_fd.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(max_sleep.count()));
    {
      std::lock_guard<std::mutex> guard{lane.mtx};
      lane.awake = true;
    }
    if (n > 0 && (fds[1].revents & POLLIN)) {
      uint64_t x = 0;
      static_cast<void>(::read(lane.wake_fd.get(), &x, sizeof(x)));
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(lane.channel.get(), &ev_cq, &ev_ctx) == 0) {
        ibv_ack_cq_events(ev_cq, 1);
        armed = false;
      }
    }
    round = check_every - 1; // straight back to the check after a wake
  }
  set_own_lane(nullptr);
}

void verbs_backend::on_completion(const ibv_wc& wc, done_list& done,
                                  std::vector<incoming_immediate>& imms) {
  if (wc.wr_id & recv_bit) {
    auto conn = wc.wr_id & ~recv_bit;
    auto i = in_.find(conn);
    if (i == in_.end())
      return; // a torn-down connection's flushed receive
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        // The receiving queue pair broke: end the connection, so the
        // sender learns it from the side channel at once.
        drop_incoming(conn);
      }
      return;
    }
    // (One-sided writes are invisible to the receiver: bytes_received stays
    // 0 on verbs.)
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM)
      imms.push_back(incoming_immediate{i->second.peer, 0, ntohl(wc.imm_data)});
    for (auto& q : i->second.qps)
      if (q.num() == wc.qp_num && q.state() != verbs::qp_state::error)
        if (post_recv(q.get(), conn)) {
          drop_incoming(conn);
          break;
        }
    return;
  }
  if (wc.wr_id & fence_bit) {
    auto lane = static_cast<size_t>((wc.wr_id >> lane_shift) & 0x3f);
    auto* o = find_conn(wc.wr_id & conn_mask);
    if (o == nullptr || lane >= o->lanes)
      return;
    auto c = static_cast<size_t>(verbs::class_of_lane(lane));
    if (wc.status != IBV_WC_SUCCESS)
      return break_outgoing(*o, transport_errc::peer_lost,
                            std::string{"connection to "} + o->peer + " broke ("
                                + ibv_wc_status_str(wc.status) + ")",
                            done);
    o->outstanding[lane] -= std::min<uint32_t>(o->outstanding[lane], 1);
    retire(*o, lane, 0, done);
    return pump(*o, c, done);
  }
  auto b = batches_.find(wc.wr_id);
  if (b == batches_.end())
    return; // failed already (its connection broke); nothing left to do
  auto& pb = b->second;
  auto c = static_cast<size_t>(pb.b.tclass);
  outgoing* o = nullptr;
  if (auto k = out_.find(pb.peer); k != out_.end() && k->second.conn == pb.conn
                                   && k->second.state == link_state::connected)
    o = &k->second;
  if (wc.status == IBV_WC_SUCCESS) {
    if (o != nullptr) {
      retire(*o, pb.lane, pb.id, done);
    } else {
      if (pb.state != batch_state::expired)
        done.emplace_back(std::move(pb.sink),
                          completion{pb.b.tag, pb.bytes, 0, caf::none});
      release(pb.id);
    }
  } else {
    auto code = code_of(wc.status);
    if (code == transport_errc::peer_lost && pb.state != batch_state::expired)
      ++stats_.peer_lost;
    auto peer = pb.peer;
    fail(pb, code,
         std::string{"work completion from "} + peer + ": "
             + ibv_wc_status_str(wc.status),
         done);
    // An RC queue pair in error stays in error: the connection is over.
    if (o != nullptr)
      break_outgoing(*o, transport_errc::peer_lost,
                     std::string{"connection to "} + peer + " broke ("
                         + ibv_wc_status_str(wc.status) + ")",
                     done);
  }
  if (o != nullptr && o->state == link_state::connected)
    pump(*o, c, done);
}

void verbs_backend::retire(outgoing& o, size_t lane, uint64_t upto,
                           done_list& done) {
  auto& wire = o.wire[lane];
  while (!wire.empty()) {
    auto id = wire.front();
    wire.pop_front();
    if (id != 0) {
      auto b = batches_.find(id);
      if (b != batches_.end()) {
        auto& pb = b->second;
        o.outstanding[lane] -= std::min(o.outstanding[lane], pb.wrs);
        if (pb.state != batch_state::expired)
          done.emplace_back(std::move(pb.sink),
                            completion{pb.b.tag, pb.bytes, 0, caf::none});
        release(id);
      }
    }
    if (id == upto)
      break;
  }
  if (o.signaled[lane] > 0)
    --o.signaled[lane];
  if (!wire.empty() && o.signaled[lane] == 0)
    post_fence(o, lane, done);
}

void verbs_backend::post_fence(outgoing& o, size_t lane, done_list& done) {
  staged st;
  st.qp = o.qps[lane];
  st.conn = o.conn;
  st.wrs.resize(1);
  auto& wr = st.wrs.front();
  wr.wr_id = fence_bit | (static_cast<uint64_t>(lane) << lane_shift) | o.conn;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.num_sge = 0; // zero bytes at a place this connection wrote to already
  wr.wr.rdma.remote_addr = o.last_target[lane].first;
  wr.wr.rdma.rkey = o.last_target[lane].second;
  wr.send_flags = IBV_SEND_SIGNALED;
  ++o.outstanding[lane];
  ++o.signaled[lane];
  o.quiet[lane] = o.quiet_wrs[lane] = 0;
  o.wire[lane].push_back(0);
  submit(o, lane, std::move(st), done);
}

void verbs_backend::check_deadlines(done_list& done) {
  // One scan finds what is due and when the next batch will be: until then
  // (a post with an earlier deadline moves it) nothing scans again.
  auto now = clock_type::now();
  auto next = now + max_sleep;
  std::vector<uint64_t> due;
  for (auto& [id, pb] : batches_) {
    auto at = pb.state == batch_state::expired
                  ? pb.b.deadline + opts_.io_timeout
                  : pb.b.deadline;
    if (now >= at)
      due.push_back(id);
    else
      next = std::min(next, at);
  }
  for (auto id : due) {
    auto b = batches_.find(id);
    if (b == batches_.end())
      continue; // ended with a connection broken meanwhile
    auto& pb = b->second;
    auto o = out_.find(pb.peer);
    auto c = static_cast<size_t>(pb.b.tclass);
    switch (pb.state) {
      case batch_state::parked:
      case batch_state::queued:
        if (o != out_.end()) {
          auto& x = o->second;
          x.parked.erase(std::remove(x.parked.begin(), x.parked.end(), id),
                         x.parked.end());
          x.queued[c].erase(
              std::remove(x.queued[c].begin(), x.queued[c].end(), id),
              x.queued[c].end());
        }
        fail(pb, transport_errc::deadline_exceeded,
             "verbs batch to " + pb.peer + " missed its deadline", done);
        break;
      case batch_state::posted:
        // Answer now; the source stays in use until the device is done.
        done.emplace_back(
            std::move(pb.sink),
            completion{pb.b.tag, 0, static_cast<uint32_t>(pb.b.writes.size()),
                       caf::make_error(transport_errc::deadline_exceeded,
                                       "verbs batch to " + pb.peer
                                           + " missed its deadline")});
        pb.state = batch_state::expired;
        // Due again once the device has had io_timeout to finish it: the
        // scan must not sleep past that (up to max_sleep late otherwise).
        next = std::min(next, pb.b.deadline + opts_.io_timeout);
        break;
      case batch_state::expired:
        if (now >= pb.b.deadline + opts_.io_timeout && o != out_.end()
            && o->second.conn == pb.conn
            && o->second.state == link_state::connected)
          break_outgoing(o->second, transport_errc::peer_lost,
                         "a batch to " + pb.peer
                             + " stayed outstanding past its deadline",
                         done);
        break;
    }
  }
  next_deadline_scan_ = next.time_since_epoch().count();
}

void verbs_backend::on_async_event(const ibv_async_event& ev, done_list& done) {
  std::string what = std::string{"device event "}
                     + ibv_event_type_str(ev.event_type) + " on " + dev_.name();
  switch (ev.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      for (auto& [name, o] : out_)
        for (auto& q : o.qps)
          if (q && q->get() == ev.element.qp) {
            break_outgoing(o, transport_errc::peer_lost, what, done);
            break;
          }
      std::vector<uint64_t> hit;
      for (auto& [conn, in] : in_)
        for (auto& q : in.qps)
          if (q && q.get() == ev.element.qp)
            hit.push_back(conn);
      for (auto conn : hit)
        drop_incoming(conn);
      break;
    }
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_DEVICE_FATAL: {
      // Every connection is gone with the port (or the device).
      for (auto& [name, o] : out_)
        break_outgoing(o, transport_errc::peer_lost, what, done);
      std::vector<uint64_t> all;
      for (auto& [conn, in] : in_)
        all.push_back(conn);
      for (auto conn : all)
        drop_incoming(conn);
      break;
    }
    default:
      break; // PORT_ACTIVE, LID/GID changes, COMM_EST: nothing to undo
  }
  wake();
}

} // namespace dualpath::transport::bulk
