// The actor system of one dualpath process that joins a deployment: every
// message type registered by name (actors/protocol/register.hpp), the middleman
// loaded, and with `tls.mode = "tls"` the openssl manager with the cluster's
// certificate, key and CA, so that every node-to-node link is TLS with mutual
// certificate checks. Publishing and connecting go through `publish_actor` and
// `connect_actor`, which pick TLS or plain middleman by the same setting.
//
// Thread safety: publish_actor / connect_actor may be called from any
// non-actor thread. Ownership: the config is owned by its caller and must
// outlive the actor system made from it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

#include "actors/node/cluster_file.hpp"
#include "config/settings.hpp"

namespace dualpath::actors::node {

class node_system_config : public caf::actor_system_config {
public:
  /// Prints the plaintext warning on `warn` when the cluster is configured
  /// without TLS.
  node_system_config(const config::settings& cfg, const cluster_file& cluster,
                     std::ostream& warn);

  link_security security() const {
    return security_;
  }

  /// Why CAF's own options (config/caf_options.hpp) did not apply, if so.
  const caf::error& caf_error() const {
    return caf_error_;
  }

private:
  link_security security_;
  caf::error caf_error_;
};

/// Publishes `hdl` on `host:port` (TLS or plain, by `security`).
caf::expected<uint16_t> publish_actor(caf::actor_system& sys,
                                      link_security security,
                                      const caf::actor& hdl,
                                      const std::string& host, uint16_t port);

/// Connects to the actor published at `host:port`; retries until
/// `patience` has passed (the peer may still be starting).
caf::expected<caf::actor> connect_actor(caf::actor_system& sys,
                                        link_security security,
                                        const std::string& host, uint16_t port,
                                        std::chrono::milliseconds patience);

/// Every setting that shapes the actors of a deployment, one "key = value"
/// line each (the model, hardware, engines and scheduler sections, the time
/// and byte scales, the modes and the block size).
std::string deployment_settings(const config::settings& cfg);

/// A short digest (hex) of deployment_settings(), so that nodes started
/// with different settings are refused.
std::string settings_digest(const config::settings& cfg);

/// Each key whose value differs between two deployment_settings() texts,
/// with both values: "model.layers = 61 on this node but 64 on the
/// scheduler node" (`our_side`, `their_side` say whose), at most eight keys
/// then how many more; "" when none differs.
std::string settings_difference(const std::string& ours,
                                const std::string& theirs,
                                const std::string& our_side,
                                const std::string& their_side);

} // namespace dualpath::actors::node
