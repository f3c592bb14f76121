// The cluster file: which nodes form a deployment, where each runs and what it
// owns. One TOML file shared by every `dualpath node` process and by
// `dualpath run --cluster` (docs/deployment.md shows a complete one):
//
//   [cluster]
//   scheduler = "sched"          # the node that runs the global scheduler
//   storage = "/mnt/kvstore"     # block store directory (shared storage mount)
//   bulk_secret = "..."          # shared secret of the bulk transport's HMAC
//                                # handshake (or bulk_secret_file = "path")
//   [tls]
//   mode = "tls"                 # "tls" (default) or "plaintext" (warns)
//   ca = "ca.pem"  cert = "node.pem"  key = "node.key"
//
//   [[node]]
//   name = "pe0"  role = "prefill"  host = "10.0.0.2"  port = 4300
//   bulk_port = 4301  gpus = [0, 1, 2, 3, 4, 5, 6, 7]
//   nics = ["mlx5_0", ...]  rdma_device = "mlx5_0"  gid_index = 3
//
// Relative paths are relative to the cluster file's directory. Every error
// names the key (and the node) that is wrong.
//
// Thread safety: plain values; parse functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

namespace dualpath::actors::node {

/// What a node of the cluster does.
enum class node_role : uint8_t {
  /// Runs the global scheduler and the node supervisor (publishes them).
  scheduler = 0,
  /// Prefill engines, one per GPU, with the node's storage reader.
  prefill = 1,
  /// Decode engines, one per GPU, with the node's storage reader.
  decode = 2,
};

std::string to_string(node_role x);

/// How nodes talk over CAF's middleman.
enum class link_security : uint8_t {
  /// TLS with mutual certificate checks against the cluster's CA.
  tls = 0,
  /// Unencrypted, unauthenticated: only when configured explicitly.
  plaintext = 1,
};

std::string to_string(link_security x);

/// One [[node]] entry.
struct node_entry {
  std::string name;
  node_role role = node_role::prefill;
  std::string host;              ///< Address other nodes reach this node at.
  uint16_t port = 0;             ///< CAF middleman port (scheduler node only).
  uint16_t bulk_port = 0;        ///< Bulk transport listen port (engine nodes).
  std::vector<uint32_t> gpus;    ///< GPU indices (one engine per GPU).
  std::vector<std::string> nics; ///< Compute NIC per GPU (RDMA device names).
  std::string rdma_device;       ///< Overrides transport.verbs_device.
  int gid_index = -1;  ///< Overrides transport.verbs_gid_index (>= 0).
  std::string storage; ///< Overrides [cluster] storage for this node.
};

struct tls_settings {
  link_security mode = link_security::tls;
  std::string ca;         ///< CA certificate (PEM) that signed every node.
  std::string cert;       ///< This deployment's node certificate (PEM).
  std::string key;        ///< Its private key (PEM).
  std::string passphrase; ///< Of the key, if encrypted.
};

struct cluster_file {
  std::string path; ///< The file it was read from.
  std::string scheduler;
  std::string storage;
  std::string bulk_secret;
  tls_settings tls;
  std::vector<node_entry> nodes;

  /// The entry named `name` (nullptr if none).
  const node_entry* find(const std::string& name) const;

  /// The scheduler's entry (parse guarantees there is one).
  const node_entry& scheduler_node() const;

  /// Names of the prefill (decode) nodes in file order.
  std::vector<std::string> names_of(node_role role) const;

  /// The storage directory of node `name`.
  std::string storage_of(const std::string& name) const;
};

/// Parses TOML text (`path` is used for messages and relative paths).
caf::expected<cluster_file> parse_cluster(const std::string& text,
                                          const std::string& path);

/// Reads and parses the file at `path`.
caf::expected<cluster_file> load_cluster(const std::string& path);

} // namespace dualpath::actors::node
