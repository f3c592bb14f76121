// Errors of the transport module as CAF error codes (errors are values).
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp> // needed by CAF_ERROR_CODE_ENUM

namespace dualpath::transport {

/// Errors of region descriptors and the bulk transport.
enum class transport_errc : uint8_t {
  /// Not an error.
  none = 0,
  /// An offset/length pair falls outside a region or view.
  out_of_bounds,
  /// No region with this id is registered at the target node.
  unknown_region,
  /// The access key does not match the region's key.
  wrong_key,
  /// A frame or message is malformed, oversized or of an unknown version.
  bad_frame,
  /// The peer did not prove it holds the shared secret (or failed TLS).
  unauthenticated,
  /// The peer is unreachable, disconnected or was dropped.
  peer_lost,
  /// The operation did not complete before its deadline.
  deadline_exceeded,
  /// A queue or budget bound was reached.
  queue_full,
  /// The backend cannot do this (see capabilities()).
  unsupported,
  /// No device exists for this backend (verbs without an RDMA NIC, ...).
  no_device,
  /// A system or driver call failed; the context names the call and errno.
  system_error,
  /// Injected by the fault-injection decorator.
  injected_fault,
  /// A setting or a peer's connection details are malformed or out of range
  /// (the context names the key or value).
  bad_config,
};

std::string to_string(transport_errc x);

/// Registers the error category with an actor system config so that
/// `actor_system::render` prints the code's name.
void add_error_category(caf::actor_system_config& cfg);

} // namespace dualpath::transport

CAF_ERROR_CODE_ENUM(dualpath::transport::transport_errc, "dp_transp")
