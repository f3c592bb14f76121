// The verbs backend's device: which RDMA device and port it uses, how peers
// address it (LID on InfiniBand, a GID on RoCE or routed InfiniBand) and the
// validated path settings (service level, GRH traffic class, hop limit) its
// queue pairs use. `device::open` checks everything a connection will need,
// so a misconfiguration fails at startup with an error naming the key.
//
// GID choice (transport.verbs_gid_index): -1 picks by link layer --
// InfiniBand: none (LID routing); Ethernet (RoCE): the RoCE v2 GID holding
// the IPv4 address of transport.tcp_listen's host if one does, else the first
// IPv4-mapped RoCE v2 GID, else the first RoCE v2 GID. An index >= 0 is used
// as given (it must exist; on RoCE it must be a RoCE GID).
//
// Ownership: a device owns its context and protection domain (RAII, move-only).
// Thread safety: immutable after open(); the ibv objects it hands out are
// thread-safe as libibverbs makes them.
#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/verbs_call.hpp"

namespace dualpath::transport::bulk::verbs {

/// KV lanes per connection at most (transport.verbs_kv_queue_pairs).
constexpr size_t max_kv_lanes = 8;
/// Queue pairs per connection at most: the control lane and the KV lanes.
constexpr size_t max_lanes = 1 + max_kv_lanes;

/// What a peer needs to address this port.
struct port_address {
  uint16_t lid = 0;
  uint8_t mtu = 0; ///< An ibv_mtu value.
  uint8_t gid[16] = {};
  bool global = false; ///< Addressed by GID (a GRH on every packet).
};

/// Per-traffic-class addressing of the queue pairs (validated ranges).
struct path_settings {
  uint8_t service_level[traffic_class_count] = {0, 0};
  uint8_t traffic_class[traffic_class_count] = {0, 0};
  uint8_t hop_limit = 64;
  uint8_t gid_index = 0; ///< Used when the port address is global.
};

/// Checks the verbs keys of `opts` (ranges the options struct cannot
/// express); the error names the key.
caf::expected<path_settings> validate_path(const options& opts);

class device {
public:
  /// Opens the device and port `opts` names. Errors: no_device (no RDMA
  /// device, none of that name, port down) or system_error/unsupported
  /// naming the key that does not fit this port.
  static caf::expected<device> open(const options& opts);

  device(device&&) = default;
  device& operator=(device&&) = default;

  ibv_context* context() const {
    return ctx_.get();
  }
  ibv_pd* pd() const {
    return pd_.get();
  }
  const std::string& name() const {
    return name_;
  }
  uint8_t port() const {
    return port_;
  }
  const port_address& address() const {
    return address_;
  }
  const path_settings& path() const {
    return path_;
  }
  /// The largest CQ and send queue the device allows.
  int max_cqe() const {
    return max_cqe_;
  }
  int max_qp_wr() const {
    return max_qp_wr_;
  }
  /// "rxe0 port 1 (RoCE v2, GID index 1 ::ffff:10.77.0.1)" and the like.
  const std::string& description() const {
    return description_;
  }

private:
  device() = default;
  // Declared in acquisition order: destroyed in reverse.
  context_ptr ctx_;
  pd_ptr pd_;
  std::string name_;
  uint8_t port_ = 1;
  port_address address_;
  path_settings path_;
  int max_cqe_ = 0;
  int max_qp_wr_ = 0;
  std::string description_;
};

/// "::ffff:10.77.0.1" style text of a GID.
std::string gid_text(const uint8_t gid[16]);

} // namespace dualpath::transport::bulk::verbs
