// Queue pair state machine of the verbs backend (see verbs_qp.hpp).
#include "transport/bulk/verbs_qp.hpp"

#include <algorithm>

#include "config/enum_names.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk::verbs {

namespace {

// RC timing: local ACK timeout 4.096 us * 2^14 (~67 ms), 7 transport retries,
// RNR retries unbounded (7): a receiver briefly out of receive work requests
// for immediates is waited for, not treated as lost.
constexpr uint8_t ack_timeout = 14;
constexpr uint8_t retry_count = 7;
constexpr uint8_t rnr_retry = 7;
constexpr uint8_t min_rnr_timer = 12;

} // namespace

constexpr std::string_view qp_state_names[] = {"RESET", "INIT", "RTR", "RTS",
                                               "ERR"};

std::string to_string(qp_state x) {
  return config::name_of(x, qp_state_names, "qp_state");
}

caf::expected<queue_pair> queue_pair::make(const device& dev, ibv_cq* send_cq,
                                           ibv_cq* recv_cq, uint32_t send_depth,
                                           uint32_t recv_depth) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq;
  init.recv_cq = recv_cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0; // selective signalling: the backend flags what it needs
  init.cap.max_send_wr = std::max<uint32_t>(send_depth, 1);
  init.cap.max_recv_wr = std::max<uint32_t>(recv_depth, 1);
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  auto qp = vptr("ibv_create_qp", ibv_create_qp(dev.pd(), &init),
                 dev.name() + ", send depth " + std::to_string(send_depth));
  if (!qp)
    return qp.error();
  queue_pair q;
  q.qp_.reset(*qp);
  q.psn_ = static_cast<uint32_t>(random_u64()) & 0xffffff;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = dev.port();
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (auto err = vcall("ibv_modify_qp(INIT)",
                       ibv_modify_qp(q.qp_.get(), &attr,
                                     IBV_QP_STATE | IBV_QP_PKEY_INDEX
                                         | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
    return err;
  q.state_ = qp_state::init;
  return q;
}

caf::error queue_pair::expect(qp_state want, const char* step) const {
  if (state_ == want)
    return caf::none;
  return caf::make_error(transport_errc::system_error,
                         std::string{"queue pair "} + std::to_string(num())
                             + ": " + step + " from " + to_string(state_));
}

caf::error queue_pair::to_rtr(const device& dev, const qp_endpoint& remote,
                              size_t lane) {
  if (auto err = expect(qp_state::init, "RTR"))
    return err;
  if (lane >= remote.lanes)
    return caf::make_error(transport_errc::system_error,
                           "the peer has no queue pair for lane "
                               + std::to_string(lane));
  auto c = static_cast<size_t>(class_of_lane(lane));
  const auto& path = dev.path();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(
      std::min<int>(dev.address().mtu, remote.address.mtu));
  attr.dest_qp_num = remote.qpn[lane];
  attr.rq_psn = remote.psn[lane];
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = min_rnr_timer;
  attr.ah_attr.sl = path.service_level[c];
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = dev.port();
  if (dev.address().global) {
    // RoCE and routed InfiniBand: a GRH. The traffic class byte carries the
    // DSCP (upper six bits) that RoCE switches map to a priority.
    if (!remote.address.global)
      return caf::make_error(transport_errc::unsupported,
                             "the peer's port has no GID but " + dev.name()
                                 + " needs one (link layers differ?)");
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.address.gid, 16);
    attr.ah_attr.grh.sgid_index = path.gid_index;
    attr.ah_attr.grh.hop_limit = path.hop_limit;
    attr.ah_attr.grh.traffic_class = path.traffic_class[c];
    attr.ah_attr.grh.flow_label = 0;
  } else {
    if (remote.address.lid == 0)
      return caf::make_error(transport_errc::unsupported,
                             "the peer's port has no LID (RoCE peer of an "
                             "InfiniBand port?)");
    attr.ah_attr.is_global = 0;
    attr.ah_attr.dlid = remote.address.lid;
  }
  if (auto err = vcall("ibv_modify_qp(RTR)",
                       ibv_modify_qp(qp_.get(), &attr,
                                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU
                                         | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
                                         | IBV_QP_MAX_DEST_RD_ATOMIC
                                         | IBV_QP_MIN_RNR_TIMER),
                       "to remote qpn " + std::to_string(remote.qpn[lane])))
    return err;
  state_ = qp_state::rtr;
  return caf::none;
}

caf::error queue_pair::to_rts() {
  if (auto err = expect(qp_state::rtr, "RTS"))
    return err;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = ack_timeout;
  attr.retry_cnt = retry_count;
  attr.rnr_retry = rnr_retry;
  attr.sq_psn = psn_;
  attr.max_rd_atomic = 1;
  if (auto err =
          vcall("ibv_modify_qp(RTS)",
                ibv_modify_qp(qp_.get(), &attr,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT
                                  | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                                  | IBV_QP_MAX_QP_RD_ATOMIC)))
    return err;
  state_ = qp_state::rts;
  return caf::none;
}

void queue_pair::to_error() {
  if (!qp_ || state_ == qp_state::error)
    return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  // If even this fails the queue pair is destroyed next, which stops it as
  // surely; the state is marked either way.
  static_cast<void>(vcall("ibv_modify_qp(ERR)",
                          ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE)));
  state_ = qp_state::error;
}

} // namespace dualpath::transport::bulk::verbs
