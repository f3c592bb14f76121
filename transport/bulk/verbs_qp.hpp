// One RC queue pair of the verbs backend and its state machine, in
// rc_pingpong's order: RESET -> INIT (port, access) -> RTR (the peer's QPN,
// PSN and address: LID, or a GRH with GID, traffic class and hop limit) ->
// RTS (our PSN, timeouts, retries); ERR from any state, where every
// outstanding work request is flushed. A transition from the wrong state is
// refused, so a queue pair is never half set up.
//
// Ownership: move-only; destroying it destroys the ibv_qp (after which the
// HCA touches none of its buffers again).
// Thread safety: none; the backend serialises access under its lock.
#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>

#include "transport/bulk/verbs_device.hpp"

namespace dualpath::transport::bulk::verbs {

enum class qp_state : uint8_t { reset, init, rtr, rts, error };

std::string to_string(qp_state x);

/// What one side of a connection tells the other: its port's address and,
/// per traffic class, the queue pair number and initial packet sequence.
struct qp_endpoint {
  port_address address;
  uint32_t qpn[traffic_class_count] = {};
  uint32_t psn[traffic_class_count] = {};
};

class queue_pair {
public:
  /// Creates an RC queue pair on `dev` with both queues on `cq`, and moves
  /// it to INIT. `send_depth`/`recv_depth` bound the work requests.
  static caf::expected<queue_pair>
  make(const device& dev, ibv_cq* cq, uint32_t send_depth, uint32_t recv_depth);

  queue_pair() = default;
  queue_pair(queue_pair&&) = default;
  queue_pair& operator=(queue_pair&&) = default;

  /// INIT -> RTR towards `remote`'s queue pair of class `tc`.
  caf::error to_rtr(const device& dev, const qp_endpoint& remote,
                    traffic_class tc);
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
