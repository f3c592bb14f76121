// One RC queue pair of the verbs backend and its state machine, in
// rc_pingpong's order: RESET -> INIT (port, access) -> RTR (the peer's QPN,
// PSN and address: LID, or a GRH with GID, traffic class and hop limit) ->
// RTS (our PSN, timeouts, retries); ERR from any state, where every
// outstanding work request is flushed. A transition from the wrong state is
// refused, so a queue pair is never half set up.
//
// Lanes: a connection has one queue pair per lane; lane 0 carries control
// traffic, lanes 1.. (transport.verbs_kv_queue_pairs of them) KV traffic.
//
// Ownership: move-only; destroying it destroys the ibv_qp (after which the
// HCA touches none of its buffers again).
// Thread safety: none; the backend serialises state changes under its lock
// (ibv_post_send on get() is thread safe, as libibverbs' calls are).
#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>

#include "transport/bulk/verbs_device.hpp"

namespace dualpath::transport::bulk::verbs {

enum class qp_state : uint8_t { reset, init, rtr, rts, error };

std::string to_string(qp_state x);

/// The traffic class a lane carries: lane 0 control, the others KV.
constexpr traffic_class class_of_lane(size_t lane) {
  return lane == 0 ? traffic_class::control : traffic_class::kv;
}

/// What one side of a connection tells the other: its port's address and,
/// per lane, the queue pair number and initial packet sequence.
struct qp_endpoint {
  port_address address;
  uint8_t lanes = 0; ///< 2..max_lanes
  uint32_t qpn[max_lanes] = {};
  uint32_t psn[max_lanes] = {};
};

class queue_pair {
public:
  /// Creates an RC queue pair on `dev` (send completions on `send_cq`,
  /// receive completions on `recv_cq`) and moves it to INIT.
  /// `send_depth`/`recv_depth` bound the work requests.
  static caf::expected<queue_pair> make(const device& dev, ibv_cq* send_cq,
                                        ibv_cq* recv_cq, uint32_t send_depth,
                                        uint32_t recv_depth);

  queue_pair() = default;
  queue_pair(queue_pair&&) = default;
  queue_pair& operator=(queue_pair&&) = default;

  /// INIT -> RTR towards `remote`'s queue pair of lane `lane` (with the
  /// path settings of that lane's traffic class).
  caf::error to_rtr(const device& dev, const qp_endpoint& remote, size_t lane);
  /// RTR -> RTS.
  caf::error to_rts();
  /// Any state -> ERR (flushes outstanding work requests); idempotent.
  void to_error();

  qp_state state() const {
    return state_;
  }
  ibv_qp* get() const {
    return qp_.get();
  }
  uint32_t num() const {
    return qp_ ? qp_->qp_num : 0;
  }
  uint32_t psn() const {
    return psn_;
  }
  explicit operator bool() const {
    return qp_ != nullptr;
  }

private:
  caf::error expect(qp_state want, const char* step) const;
  qp_ptr qp_;
  qp_state state_ = qp_state::reset;
  uint32_t psn_ = 0;
};

} // namespace dualpath::transport::bulk::verbs
