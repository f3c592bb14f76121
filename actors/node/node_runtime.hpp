// One node of a deployment (`dualpath node --cluster FILE --name NAME`) and
// the driver of `dualpath run --cluster FILE`.
//
// The scheduler node opens the shared block store, spawns the global
// scheduler with the engine table of the cluster file, the submit gate and
// the node supervisor, and publishes the supervisor on its CAF port (TLS
// unless configured otherwise). A prefill or decode node builds its
// resources as the embedded cluster does (actors/cluster/cluster.hpp:
// links, storage reader with its registered buffer pool, one engine per GPU)
// around a cross-process bulk backend (transport.backend: verbs, or tcp with
// the cluster's shared secret), connects to the supervisor, takes the
// cluster's time origin from the view, enrolls its engines with the remote
// scheduler and joins with its bulk endpoint details. A node agent then polls
// the view: it connects the bulk transport to every new peer and, when a node
// is lost, drops it and tells the local prefill engines, whose requests to
// the lost node are answered by nobody otherwise; the scheduler re-queues
// what the lost node held (actors/placement/global_scheduler.cpp).
//
// Thread safety: run_node blocks its caller until `stop` becomes true or the
// scheduler node stops or is lost; run_cluster_job blocks until the replay
// ends.
#pragma once

#include <atomic>
#include <iosfwd>
#include <memory>
#include <string>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/cluster/cluster.hpp"
#include "actors/cluster/job.hpp"
#include "actors/node/cluster_file.hpp"
#include "config/settings.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::transport::storage {
class block_store;
} // namespace dualpath::transport::storage

namespace dualpath::actors::node {

/// The cluster a deployment's nodes build from its settings and cluster
/// file: the one mode it runs, the node counts of the file. Bad input
/// (caf::sec::invalid_argument) names the key or the node that does not fit.
caf::expected<cluster::cluster_spec>
deployment_spec(const config::settings& cfg, const cluster_file& cluster);

/// Opens (creating) the block store at `dir` with the spec's model id and
/// geometry and the storage.* settings, as every node of the deployment does.
caf::expected<std::shared_ptr<transport::storage::block_store>>
open_store(const config::settings& cfg, const cluster::cluster_spec& spec,
           const std::string& dir);

/// The bulk transport options of engine node `me`: transport.* of the
/// settings, the cluster's secret, the entry's listen address, RDMA device
/// and GID index. transport.backend = local (no other process can reach it)
/// is bad input.
caf::expected<transport::bulk::options>
node_bulk_options(const config::settings& cfg, const cluster_file& cluster,
                  const node_entry& me);

/// Runs node `name` of `cluster` (see file comment). Progress and warnings go
/// to `log`. Returns an error when the node cannot start or loses the
/// scheduler node; none after a requested stop, its own or the scheduler
/// node's (stopped on purpose, which stops the deployment).
caf::error run_node(const config::settings& cfg, const cluster_file& cluster,
                    const std::string& name, const std::atomic<bool>& stop,
                    std::ostream& log);

/// Replays the job's trace against the running deployment of `cluster`
/// (every node of the file must have joined within `opts.wall_limit`) and
/// returns the same report as the embedded run, for the deployment's one
/// mode. The driver writes the trajectories' history into the shared store
/// first (it must see the storage mount).
caf::expected<cluster::job_result>
run_cluster_job(const config::settings& cfg, const cluster_file& cluster,
                const cluster::job_options& opts, std::ostream& log);

} // namespace dualpath::actors::node
