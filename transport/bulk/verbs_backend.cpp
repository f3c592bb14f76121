// The verbs backend (rdma-core): one-sided RDMA WRITEs over RC queue pairs.
//
// Resources follow rdma-core's rc_pingpong order and 3FS's ownership habits:
// device context -> protection domain -> completion channel -> completion
// queue -> memory regions -> queue pairs, each held by a unique_ptr with its
// ibv_* destroy call as the deleter and declared so that destruction runs in
// reverse. Each peer gets one RC queue pair per traffic class; the class's
// service level (transport.verbs_sl_control / verbs_sl_kv) goes into the
// queue pair's address vector so the fabric's VL arbitration (InfiniBand) or
// traffic-class/DSCP priority (RoCE, through the GRH traffic class) applies.
// Queue-pair information (QPN, PSN, LID, GID, MTU) travels in actor messages
// (endpoint_info.details): details_for(peer) creates the pair's queue pairs
// (RESET->INIT) and describes them; connect(peer, details) moves them
// INIT->RTR->RTS.
//
// A batch is one linked chain of RDMA WRITE work requests (WRITE_WITH_IMM for
// the last when an immediate is given) posted with a single ibv_post_send
// (doorbell batching); only the last is signaled. At most
// transport.verbs_max_outstanding work requests are outstanding per queue
// pair; further batches wait in a per-queue-pair FIFO and are posted as
// completions free room. A polling thread turns completions into completion
// sink calls (and, for actors, messages), delivers immediates and enforces
// deadlines: an expired batch moves its queue pair to ERR, which flushes every
// outstanding work request, and the peer must be connected again.
//
// Every ibv_* call goes through `vcall`/`vptr`, which keep the call's name and
// errno in the returned error.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

namespace {

/// Error of a failed ibv_* call: its name and errno (ibv_* return the errno
/// value itself or set errno).
caf::error verbs_error(const char* call, int err) {
  return caf::make_error(transport_errc::system_error,
                         std::string{call} + ": " + std::strerror(err) + " ("
                             + std::to_string(err) + ")");
}

/// Checks an int-returning ibv_* call (0 = success, else an errno value).
caf::error vcall(const char* call, int rc) {
  if (rc == 0)
    return caf::none;
  return verbs_error(call, rc > 0 ? rc : errno);
}

/// Checks a pointer-returning ibv_* call (nullptr = failure, errno set).
template <class T>
caf::expected<T*> vptr(const char* call, T* ptr) {
  if (ptr != nullptr)
    return ptr;
  return verbs_error(call, errno != 0 ? errno : EINVAL);
}

/// Registers GPU memory exported as dma-buf `fd`, the fd covering exactly
/// [ptr, ptr + len) (offset 0 in it; the iova is the device address). A NIC,
/// driver or kernel without dma-buf support answers EOPNOTSUPP (or ENOSYS,
/// EPROTONOSUPPORT): that is transport_errc::unsupported, so the caller
/// stages through registered host memory instead; anything else is the
/// call's system error.
caf::expected<ibv_mr*> reg_dmabuf_mr(ibv_pd* pd, void* ptr, uint64_t len,
                                     int fd, int access) {
  errno = 0;
  auto mr = ibv_reg_dmabuf_mr(pd, 0, len, reinterpret_cast<uint64_t>(ptr), fd,
                              access);
  if (mr != nullptr)
    return mr;
  const int err = errno != 0 ? errno : EINVAL;
  if (err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT)
    return caf::make_error(transport_errc::unsupported,
                           std::string{"ibv_reg_dmabuf_mr: "}
                               + std::strerror(err) + " (" + std::to_string(err)
                               + "): this NIC, driver or kernel cannot "
                                 "register GPU memory");
  return verbs_error("ibv_reg_dmabuf_mr", err);
}

struct device_list_deleter {
  void operator()(ibv_device** p) const {
    ibv_free_device_list(p);
  }
};
struct context_deleter {
  void operator()(ibv_context* p) const {
    ibv_close_device(p);
  }
};
struct pd_deleter {
  void operator()(ibv_pd* p) const {
    ibv_dealloc_pd(p);
  }
};
struct channel_deleter {
  void operator()(ibv_comp_channel* p) const {
    ibv_destroy_comp_channel(p);
  }
};
struct cq_deleter {
  void operator()(ibv_cq* p) const {
    ibv_destroy_cq(p);
  }
};
struct mr_deleter {
  void operator()(ibv_mr* p) const {
    ibv_dereg_mr(p);
  }
};
struct qp_deleter {
  void operator()(ibv_qp* p) const {
    ibv_destroy_qp(p);
  }
};

using device_list_ptr = std::unique_ptr<ibv_device*, device_list_deleter>;
using context_ptr = std::unique_ptr<ibv_context, context_deleter>;
using pd_ptr = std::unique_ptr<ibv_pd, pd_deleter>;
using channel_ptr = std::unique_ptr<ibv_comp_channel, channel_deleter>;
using cq_ptr = std::unique_ptr<ibv_cq, cq_deleter>;
using mr_ptr = std::unique_ptr<ibv_mr, mr_deleter>;
using qp_ptr = std::unique_ptr<ibv_qp, qp_deleter>;

constexpr uint32_t recv_depth = 64; // receives posted for WRITE_WITH_IMM
constexpr uint64_t max_wr_bytes = 1u << 30;
constexpr uint8_t details_version = 1;

/// Serialized queue-pair information of one side of a peer pair.
struct qp_info {
  uint16_t lid = 0;
  uint8_t mtu = 0;
  uint8_t gid[16] = {};
  uint32_t qpn[traffic_class_count] = {};
  uint32_t psn[traffic_class_count] = {};
};

std::vector<uint8_t> encode(const qp_info& x) {
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) {
    auto b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  out.push_back(details_version);
  put(&x.lid, sizeof(x.lid));
  put(&x.mtu, sizeof(x.mtu));
  put(x.gid, sizeof(x.gid));
  put(x.qpn, sizeof(x.qpn));
  put(x.psn, sizeof(x.psn));
  return out;
}

caf::expected<qp_info> decode(const std::vector<uint8_t>& in) {
  qp_info x;
  const size_t want = 1 + sizeof(x.lid) + sizeof(x.mtu) + sizeof(x.gid)
                      + sizeof(x.qpn) + sizeof(x.psn);
  if (in.size() != want || in[0] != details_version)
    return caf::make_error(transport_errc::bad_frame,
                           "verbs details of the wrong size or version");
  size_t pos = 1;
  auto get = [&](void* p, size_t n) {
    std::memcpy(p, in.data() + pos, n);
    pos += n;
  };
  get(&x.lid, sizeof(x.lid));
  get(&x.mtu, sizeof(x.mtu));
  get(x.gid, sizeof(x.gid));
  get(x.qpn, sizeof(x.qpn));
  get(x.psn, sizeof(x.psn));
  return x;
}

struct pending_batch {
  uint64_t id = 0;
  batch b;
  completion_sink sink;
  uint32_t wrs = 0;
  uint64_t bytes = 0;
  bool posted = false;
};

/// One RC queue pair towards a peer for one traffic class.
struct queue_pair {
  qp_ptr qp;
  uint32_t psn = 0;
  bool ready = false;  ///< In RTS.
  bool broken = false; ///< Moved to ERR; the peer must connect again.
  uint32_t outstanding = 0;
  std::deque<uint64_t> waiting; ///< Batch ids not yet posted (FIFO).
};

struct peer_qps {
  std::string name;
  queue_pair qps[traffic_class_count];
};

class verbs_backend final : public backend {
public:
  explicit verbs_backend(const options& opts) : opts_(opts) {
    // nop
  }

  ~verbs_backend() override {
    // Teardown: queue pairs to ERR (flushing their work requests), drain the
    // CQ so every pending batch completes, stop the poller, then the unique_ptr
    // members are destroyed in reverse order of acquisition.
    {
      std::lock_guard<std::mutex> guard{mtx_};
      for (auto& [name, p] : peers_)
        for (auto& q : p.qps)
          to_error(q);
    }
    auto until = clock_type::now() + std::chrono::seconds{2};
    while (clock_type::now() < until && drain_once() > 0) {
      // keep draining
    }
    stop_ = true;
    if (poller_.joinable())
      poller_.join();
    std::vector<std::pair<completion_sink, completion>> done;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      for (auto& [id, pb] : batches_)
        done.emplace_back(
            std::move(pb.sink),
            failed(pb, transport_errc::peer_lost, "verbs backend shut down"));
      batches_.clear();
      peers_.clear(); // destroys queue pairs before the CQ and PD
      mrs_.clear();
    }
    for (auto& [sink, res] : done)
      if (sink)
        sink(std::move(res));
  }

  caf::error open() {
    int n = 0;
    errno = 0;
    device_list_ptr list{ibv_get_device_list(&n)};
    if (!list || n == 0)
      return caf::make_error(
          transport_errc::no_device,
          std::string{"ibv_get_device_list: no RDMA device ("}
              + std::strerror(errno != 0 ? errno : ENODEV) + ")");
    ibv_device* dev = nullptr;
    for (int i = 0; i < n; ++i)
      if (opts_.verbs_device.empty()
          || opts_.verbs_device == ibv_get_device_name(list.get()[i])) {
        dev = list.get()[i];
        break;
      }
    if (dev == nullptr)
      return caf::make_error(transport_errc::no_device,
                             "no RDMA device named " + opts_.verbs_device);
    device_name_ = ibv_get_device_name(dev);
    auto ctx = vptr("ibv_open_device", ibv_open_device(dev));
    if (!ctx)
      return ctx.error();
    ctx_.reset(*ctx);
    if (auto err = vcall("ibv_query_port",
                         ibv_query_port(ctx_.get(), opts_.verbs_port, &port_)))
      return err;
    if (port_.state != IBV_PORT_ACTIVE)
      return caf::make_error(transport_errc::no_device,
                             device_name_ + " port "
                                 + std::to_string(opts_.verbs_port)
                                 + " is not active");
    // RoCE (or routed InfiniBand) addresses by GID; plain InfiniBand by LID.
    if (opts_.verbs_gid_index >= 0)
      if (auto err = vcall("ibv_query_gid",
                           ibv_query_gid(ctx_.get(), opts_.verbs_port,
                                         opts_.verbs_gid_index, &gid_)))
        return err;
    auto pd = vptr("ibv_alloc_pd", ibv_alloc_pd(ctx_.get()));
    if (!pd)
      return pd.error();
    pd_.reset(*pd);
    auto ch =
        vptr("ibv_create_comp_channel", ibv_create_comp_channel(ctx_.get()));
    if (!ch)
      return ch.error();
    channel_.reset(*ch);
    auto cq = vptr("ibv_create_cq",
                   ibv_create_cq(ctx_.get(), 4096, nullptr, channel_.get(), 0));
    if (!cq)
      return cq.error();
    cq_.reset(*cq);
    if (auto err = vcall("ibv_req_notify_cq", ibv_req_notify_cq(cq_.get(), 0)))
      return err;
    poller_ = std::thread{[this] { poll_loop(); }};
    return caf::none;
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "verbs";
    c.immediate = true;
    c.device_memory = true;
    c.cross_process = true;
    return c;
  }

  const std::string& node() const override {
    return opts_.node;
  }

  caf::expected<local_registration> register_region(void* ptr, uint64_t len,
                                                    memory_kind kind,
                                                    int dmabuf_fd) override {
    if (ptr == nullptr || len == 0)
      return caf::make_error(transport_errc::out_of_bounds, "empty region");
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                       | IBV_ACCESS_REMOTE_READ;
    caf::expected<ibv_mr*> mr{nullptr};
    if (kind == memory_kind::device) {
      if (dmabuf_fd < 0)
        return caf::make_error(transport_errc::unsupported,
                               "GPU memory needs a dmabuf fd");
      mr = reg_dmabuf_mr(pd_.get(), ptr, len, dmabuf_fd, access);
    } else {
      mr = vptr("ibv_reg_mr", ibv_reg_mr(pd_.get(), ptr, len, access));
    }
    if (!mr)
      return mr.error();
    remote_region desc;
    desc.node = opts_.node;
    desc.key = (*mr)->rkey;
    desc.base = reinterpret_cast<uint64_t>(ptr);
    desc.length = len;
    uint32_t lkey = (*mr)->lkey;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      desc.region_id = next_region_++;
      mrs_[desc.region_id].reset(*mr);
    }
    local_registration reg{this, ptr, len, kind, std::move(desc)};
    reg.lkey = lkey;
    return reg;
  }

  caf::expected<std::vector<uint8_t>>
  details_for(const std::string& peer) override {
    std::lock_guard<std::mutex> guard{mtx_};
    auto p = ensure_qps(peer);
    if (!p)
      return p.error();
    qp_info info;
    info.lid = port_.lid;
    info.mtu = static_cast<uint8_t>(port_.active_mtu);
    std::memcpy(info.gid, gid_.raw, sizeof(info.gid));
    for (size_t c = 0; c < traffic_class_count; ++c) {
      info.qpn[c] = (*p)->qps[c].qp->qp_num;
      info.psn[c] = (*p)->qps[c].psn;
    }
    return encode(info);
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override {
    auto remote = decode(details);
    if (!remote)
      return remote.error();
    std::lock_guard<std::mutex> guard{mtx_};
    auto p = ensure_qps(peer);
    if (!p)
      return p.error();
    for (size_t c = 0; c < traffic_class_count; ++c) {
      auto& q = (*p)->qps[c];
      if (auto err = to_rtr(q, *remote, c))
        return err;
      if (auto err = to_rts(q))
        return err;
      q.ready = true;
    }
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    post_defaults(b, opts_);
    if (auto err = validate(b))
      return complete_now(std::move(sink), b, std::move(err));
    uint32_t wrs = 0;
    uint64_t bytes = 0;
    for (auto& w : b.writes) {
      wrs += static_cast<uint32_t>((w.destination.length + max_wr_bytes - 1)
                                   / max_wr_bytes);
      bytes += w.destination.length;
      if (w.source->lkey == 0 && w.source->size() > 0)
        return complete_now(std::move(sink), b,
                            caf::make_error(transport_errc::unknown_region,
                                            "source not registered with "
                                            "verbs"));
    }
    if (wrs > opts_.verbs_max_outstanding)
      return complete_now(std::move(sink), b,
                          caf::make_error(transport_errc::queue_full,
                                          "batch exceeds "
                                          "verbs_max_outstanding"));
    std::unique_lock<std::mutex> guard{mtx_};
    auto i = peers_.find(b.writes.front().destination.node);
    if (i == peers_.end()) {
      guard.unlock();
      return complete_now(
          std::move(sink), b,
          caf::make_error(transport_errc::peer_lost,
                          "not connected to "
                              + b.writes.front().destination.node));
    }
    auto& q = i->second.qps[static_cast<size_t>(b.tclass)];
    if (!q.ready || q.broken) {
      guard.unlock();
      return complete_now(
          std::move(sink), b,
          caf::make_error(transport_errc::peer_lost,
                          "queue pair to " + i->first + " is not connected"));
    }
    auto id = next_batch_++;
    auto& pb = batches_[id];
    pb.id = id;
    pb.b = std::move(b);
    pb.sink = std::move(sink);
    pb.wrs = wrs;
    pb.bytes = bytes;
    {
      std::lock_guard<std::mutex> g2{stats_mtx_};
      ++stats_.batches_posted;
    }
    q.waiting.push_back(id);
    auto done = pump(q);
    guard.unlock();
    deliver(done);
  }

  void on_immediate(immediate_handler f) override {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    handler_ = std::move(f);
  }

  counters stats() const override {
    std::lock_guard<std::mutex> guard{stats_mtx_};
    return stats_;
  }

  void drop_peer(const std::string& peer) override {
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = peers_.find(peer);
    if (i == peers_.end())
      return;
    for (auto& q : i->second.qps)
      to_error(q); // flushed completions fail the outstanding batches
  }

protected:
  void deregister(uint32_t region_id) override {
    std::lock_guard<std::mutex> guard{mtx_};
    mrs_.erase(region_id);
  }

private:
  using done_list = std::vector<std::pair<completion_sink, completion>>;

  completion failed(const pending_batch& pb, transport_errc code,
                    std::string why) {
    return completion{pb.b.tag, 0, static_cast<uint32_t>(pb.b.writes.size()),
                      caf::make_error(code, std::move(why))};
  }

  void complete_now(completion_sink sink, const batch& b, caf::error err) {
    {
      std::lock_guard<std::mutex> guard{stats_mtx_};
      ++stats_.batches_posted;
      ++stats_.batches_failed;
    }
    if (sink)
      sink(completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                      std::move(err)});
  }

  void deliver(done_list& done) {
    for (auto& [sink, res] : done) {
      {
        std::lock_guard<std::mutex> guard{stats_mtx_};
        if (res.error) {
          ++stats_.batches_failed;
          auto code = static_cast<transport_errc>(res.error.code());
          if (code == transport_errc::deadline_exceeded)
            ++stats_.deadline_exceeded;
          if (code == transport_errc::peer_lost)
            ++stats_.peer_lost;
        } else {
          ++stats_.batches_completed;
        }
      }
      if (sink)
        sink(std::move(res));
    }
    done.clear();
  }

  caf::expected<peer_qps*> ensure_qps(const std::string& peer) {
    auto i = peers_.find(peer);
    if (i != peers_.end() && !i->second.qps[0].broken
        && !i->second.qps[1].broken)
      return &i->second;
    if (i != peers_.end())
      peers_.erase(i); // broken: make fresh queue pairs (reconnect)
    auto& p = peers_[peer];
    p.name = peer;
    for (auto& q : p.qps) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_.get();
      init.recv_cq = cq_.get();
      init.qp_type = IBV_QPT_RC;
      init.sq_sig_all = 0;
      init.cap.max_send_wr = opts_.verbs_max_outstanding;
      init.cap.max_recv_wr = recv_depth;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      auto qp = vptr("ibv_create_qp", ibv_create_qp(pd_.get(), &init));
      if (!qp) {
        peers_.erase(peer);
        return qp.error();
      }
      q.qp.reset(*qp);
      q.psn = static_cast<uint32_t>(random_u64()) & 0xffffff;
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_INIT;
      attr.pkey_index = 0;
      attr.port_num = opts_.verbs_port;
      attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
                             | IBV_ACCESS_LOCAL_WRITE;
      if (auto err =
              vcall("ibv_modify_qp(INIT)",
                    ibv_modify_qp(q.qp.get(), &attr,
                                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                                      | IBV_QP_ACCESS_FLAGS))) {
        peers_.erase(peer);
        return err;
      }
      // Receives consume WRITE_WITH_IMM notifications (no payload).
      for (uint32_t r = 0; r < recv_depth; ++r)
        if (auto err = post_recv(q)) {
          peers_.erase(peer);
          return err;
        }
    }
    return &p;
  }

  caf::error post_recv(queue_pair& q) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = 0;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    return vcall("ibv_post_recv", ibv_post_recv(q.qp.get(), &wr, &bad));
  }

  caf::error to_rtr(queue_pair& q, const qp_info& remote, size_t tclass) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu =
        static_cast<ibv_mtu>(std::min<int>(port_.active_mtu, remote.mtu));
    attr.dest_qp_num = remote.qpn[tclass];
    attr.rq_psn = remote.psn[tclass];
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.is_global = 0;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = tclass == 0 ? opts_.verbs_sl_control : opts_.verbs_sl_kv;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = opts_.verbs_port;
    bool has_gid = false;
    for (auto x : remote.gid)
      has_gid = has_gid || x != 0;
    if (has_gid && opts_.verbs_gid_index >= 0) {
      // RoCE (and routed IB) needs the GRH; its traffic class carries the
      // priority as DSCP (service level * 8, shifted past the ECN bits).
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(opts_.verbs_gid_index);
      attr.ah_attr.grh.hop_limit = 1;
      attr.ah_attr.grh.traffic_class =
          static_cast<uint8_t>((attr.ah_attr.sl * 8) << 2);
    }
    return vcall("ibv_modify_qp(RTR)",
                 ibv_modify_qp(q.qp.get(), &attr,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU
                                   | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
                                   | IBV_QP_MAX_DEST_RD_ATOMIC
                                   | IBV_QP_MIN_RNR_TIMER));
  }

  caf::error to_rts(queue_pair& q) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = q.psn;
    attr.max_rd_atomic = 1;
    return vcall("ibv_modify_qp(RTS)",
                 ibv_modify_qp(q.qp.get(), &attr,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT
                                   | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                                   | IBV_QP_MAX_QP_RD_ATOMIC));
  }

  void to_error(queue_pair& q) {
    if (!q.qp || q.broken)
      return;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    // Failure here leaves nothing better to do than report through the
    // flushed completions that do arrive; the state is still marked broken.
    static_cast<void>(vcall("ibv_modify_qp(ERR)",
                            ibv_modify_qp(q.qp.get(), &attr, IBV_QP_STATE)));
    q.broken = true;
    q.ready = false;
  }

  /// Posts waiting batches while the outstanding bound allows (mtx_ held).
  done_list pump(queue_pair& q) {
    done_list done;
    while (!q.waiting.empty()) {
      auto& pb = batches_.at(q.waiting.front());
      if (q.outstanding + pb.wrs > opts_.verbs_max_outstanding)
        break;
      q.waiting.pop_front();
      std::vector<ibv_sge> sges;
      std::vector<ibv_send_wr> wrs;
      sges.reserve(pb.wrs);
      wrs.reserve(pb.wrs);
      for (auto& w : pb.b.writes) {
        uint64_t off = 0;
        do {
          auto n = std::min(max_wr_bytes, w.destination.length - off);
          ibv_sge sge{};
          sge.addr = reinterpret_cast<uint64_t>(w.source->data())
                     + w.source_offset + off;
          sge.length = static_cast<uint32_t>(n);
          sge.lkey = w.source->lkey;
          sges.push_back(sge);
          ibv_send_wr wr{};
          wr.wr_id = pb.id;
          wr.opcode = IBV_WR_RDMA_WRITE;
          wr.wr.rdma.remote_addr =
              w.destination.base + w.destination.offset + off;
          wr.wr.rdma.rkey = static_cast<uint32_t>(w.destination.key);
          wrs.push_back(wr);
          off += n;
        } while (off < w.destination.length);
      }
      for (size_t k = 0; k < wrs.size(); ++k) {
        wrs[k].sg_list = &sges[k];
        wrs[k].num_sge = 1;
        wrs[k].next = k + 1 < wrs.size() ? &wrs[k + 1] : nullptr;
      }
      // Only the last work request is signaled: one completion per batch.
      auto& last = wrs.back();
      last.send_flags = IBV_SEND_SIGNALED;
      if (pb.b.immediate) {
        last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        last.imm_data = htonl(*pb.b.immediate);
      }
      ibv_send_wr* bad = nullptr;
      if (auto err = vcall("ibv_post_send",
                           ibv_post_send(q.qp.get(), wrs.data(), &bad))) {
        done.emplace_back(std::move(pb.sink),
                          completion{pb.b.tag, 0,
                                     static_cast<uint32_t>(pb.b.writes.size()),
                                     std::move(err)});
        batches_.erase(pb.id);
        continue;
      }
      pb.posted = true;
      q.outstanding += pb.wrs;
      std::lock_guard<std::mutex> guard{stats_mtx_};
      stats_.bytes_sent[static_cast<size_t>(pb.b.tclass)] += pb.bytes;
    }
    return done;
  }

  queue_pair* find_qp(uint32_t qp_num, std::string* peer) {
    for (auto& [name, p] : peers_)
      for (auto& q : p.qps)
        if (q.qp && q.qp->qp_num == qp_num) {
          if (peer)
            *peer = name;
          return &q;
        }
    return nullptr;
  }

  /// Polls the CQ once; returns the number of completions handled.
  int drain_once() {
    if (!cq_)
      return 0;
    ibv_wc wcs[32];
    int n = ibv_poll_cq(cq_.get(), 32, wcs);
    if (n <= 0)
      return 0;
    done_list done;
    std::vector<incoming_immediate> imms;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      for (int i = 0; i < n; ++i)
        handle(wcs[i], done, imms);
    }
    deliver(done);
    for (auto& x : imms) {
      std::lock_guard<std::mutex> guard{handler_mtx_};
      if (handler_)
        handler_(x);
    }
    return n;
  }

  void handle(const ibv_wc& wc, done_list& done,
              std::vector<incoming_immediate>& imms) {
    std::string peer;
    auto* q = find_qp(wc.qp_num, &peer);
    if (wc.wr_id == 0) { // receives carry wr_id 0, batches start at 1
      if (wc.status == IBV_WC_SUCCESS
          && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        imms.push_back(incoming_immediate{peer, 0, ntohl(wc.imm_data)});
        std::lock_guard<std::mutex> guard{stats_mtx_};
        stats_.bytes_received += wc.byte_len;
      }
      if (q && !q->broken)
        static_cast<void>(post_recv(*q));
      return;
    }
    auto i = batches_.find(wc.wr_id);
    if (i == batches_.end())
      return; // an earlier error completion already finished this batch
    auto& pb = i->second;
    if (q)
      q->outstanding -= std::min(q->outstanding, pb.wrs);
    if (wc.status == IBV_WC_SUCCESS) {
      done.emplace_back(std::move(pb.sink),
                        completion{pb.b.tag, pb.bytes, 0, caf::none});
    } else {
      auto code =
          wc.status == IBV_WC_WR_FLUSH_ERR || wc.status == IBV_WC_RETRY_EXC_ERR
              ? transport_errc::peer_lost
          : wc.status == IBV_WC_REM_ACCESS_ERR ? transport_errc::wrong_key
                                               : transport_errc::system_error;
      done.emplace_back(std::move(pb.sink),
                        failed(pb, code,
                               std::string{"work completion: "}
                                   + ibv_wc_status_str(wc.status)));
      if (q)
        to_error(*q); // an RC queue pair in error stays in error
    }
    batches_.erase(i);
    if (q && !q->broken) {
      auto more = pump(*q);
      done.insert(done.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
    }
  }

  void check_deadlines() {
    done_list done;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      auto now = clock_type::now();
      for (auto i = batches_.begin(); i != batches_.end();) {
        auto& pb = i->second;
        if (now < pb.b.deadline) {
          ++i;
          continue;
        }
        done.emplace_back(std::move(pb.sink),
                          failed(pb, transport_errc::deadline_exceeded,
                                 "verbs batch missed its deadline"));
        auto p = peers_.find(pb.b.writes.front().destination.node);
        if (p != peers_.end()) {
          auto& q = p->second.qps[static_cast<size_t>(pb.b.tclass)];
          // The HCA may still read the source: stop the queue pair.
          if (pb.posted)
            to_error(q);
          else
            q.waiting.erase(
                std::remove(q.waiting.begin(), q.waiting.end(), pb.id),
                q.waiting.end());
        }
        i = batches_.erase(i);
      }
    }
    deliver(done);
  }

  void poll_loop() {
    while (!stop_) {
      pollfd pfd{channel_->fd, POLLIN, 0};
      if (::poll(&pfd, 1, 10) > 0) {
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx) == 0) {
          ibv_ack_cq_events(ev_cq, 1);
          static_cast<void>(
              vcall("ibv_req_notify_cq", ibv_req_notify_cq(cq_.get(), 0)));
        }
      }
      while (drain_once() > 0) {
        // drain everything that is ready
      }
      check_deadlines();
    }
  }

  options opts_;
  std::string device_name_;
  ibv_port_attr port_{};
  ibv_gid gid_{};
  // Declared in acquisition order: destroyed in reverse.
  context_ptr ctx_;
  pd_ptr pd_;
  channel_ptr channel_;
  cq_ptr cq_;
  std::mutex mtx_; // guards mrs_, peers_, batches_
  std::unordered_map<uint32_t, mr_ptr> mrs_;
  std::map<std::string, peer_qps> peers_;
  std::unordered_map<uint64_t, pending_batch> batches_;
  uint32_t next_region_ = 1;
  uint64_t next_batch_ = 1;
  std::mutex handler_mtx_;
  immediate_handler handler_;
  mutable std::mutex stats_mtx_;
  counters stats_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
};

} // namespace

caf::expected<std::unique_ptr<backend>>
make_verbs_backend(const options& opts) {
  auto ptr = std::make_unique<verbs_backend>(opts);
  if (auto err = ptr->open())
    return err;
  return std::unique_ptr<backend>{std::move(ptr)};
}

} // namespace dualpath::transport::bulk
