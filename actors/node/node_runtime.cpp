#include "actors/node/node_runtime.hpp"

#include <algorithm>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/type_id.hpp>

#include "actors/bulk/bulk_endpoint.hpp"
#include "actors/cluster/bounds.hpp"
#include "actors/cluster/cluster.hpp"
#include "actors/cluster/observe_session.hpp"
#include "actors/cluster/replay.hpp"
#include "actors/node/node_system.hpp"
#include "actors/node/supervisor.hpp"
#include "actors/placement/global_scheduler.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "actors/protocol/register.hpp"
#include "scheduler/workload/trajectory.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/storage/block_store.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::node::runtime_atoms, tick_atom,
             "nodetick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::node::runtime_atoms, snic_atom,
             "snicusage")

namespace dualpath::actors::node {

namespace {

using namespace dualpath::actors::node::runtime_atoms;

using namespace std::chrono;
namespace storage = transport::storage;

caf::error node_error(const std::string& what) {
  return caf::make_error(caf::sec::runtime_error, what);
}

caf::error bad_input(const std::string& what) {
  return caf::make_error(caf::sec::invalid_argument, what);
}

constexpr auto view_period = milliseconds(200);
constexpr auto connect_patience = seconds(30);

// The one variant a deployment runs: run.modes if it names one, else
// dualpath (a deployment's engines are built for one mode).
caf::expected<cluster::run_variant>
deployment_variant(const config::settings& cfg) {
  auto modes = cluster::parse_variants(cfg.string("run.modes"));
  if (!modes)
    return modes.error();
  if (modes->size() == 1)
    return modes->front();
  for (auto& m : *modes)
    if (m.name == "dualpath")
      return m;
  return modes->front();
}

} // namespace

caf::expected<cluster::cluster_spec>
deployment_spec(const config::settings& cfg, const cluster_file& cf) {
  auto variant = deployment_variant(cfg);
  if (!variant)
    return variant.error();
  auto spec = cluster::spec_from(cfg, variant->mode);
  if (!spec)
    return spec.error();
  if (spec->layers_per_step != 1)
    return bad_input("sim.layers_per_step applies to `dualpath sim` only "
                     "(a deployment moves every layer's bytes)");
  if (variant->round_robin) {
    spec->policy.kind = scheduler::policy_kind::basic;
    spec->policy.reads = scheduler::read_mode::shorter_queue;
  }
  spec->prefill_nodes =
      static_cast<uint32_t>(cf.names_of(node_role::prefill).size());
  spec->decode_nodes =
      static_cast<uint32_t>(cf.names_of(node_role::decode).size());
  for (auto& n : cf.nodes)
    if (n.role != node_role::scheduler && !n.gpus.empty()
        && n.gpus.size() != spec->gpus_per_node)
      return bad_input("cluster file " + cf.path + ": node '" + n.name
                       + "' lists " + std::to_string(n.gpus.size())
                       + " gpus but hardware.gpus_per_node is "
                       + std::to_string(spec->gpus_per_node));
  return spec;
}

// Opens (creating) the block store at `dir` with the spec's geometry.
caf::expected<std::shared_ptr<storage::block_store>>
open_store(const config::settings& cfg, const cluster::cluster_spec& spec,
           const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return bad_input("storage directory " + dir + ": " + ec.message());
  storage::backend_config bc;
  if (!from_string(cfg.string("storage.backend"), bc.kind))
    return bad_input("storage.backend: unknown backend "
                     + cfg.string("storage.backend"));
  bc.queue_depth = static_cast<uint32_t>(cfg.integer("storage.queue_depth"));
  storage::store_config sc;
  sc.model_id = spec.model.name;
  sc.geometry.layers = spec.model.layers;
  sc.geometry.block_tokens = spec.block_tokens;
  sc.geometry.bytes_per_token_layer =
      static_cast<uint32_t>(cluster::real_bytes_per_token_layer(spec));
  sc.mode = cfg.boolean("storage.o_direct") ? storage::io_mode::direct
                                            : storage::io_mode::buffered;
  sc.sync = cfg.boolean("storage.fsync") ? storage::durability::fsync
                                         : storage::durability::none;
  sc.directory = dir;
  auto backend = storage::make_backend(bc);
  if (!backend)
    return backend.error();
  auto opened = storage::block_store::open(sc, std::move(*backend));
  if (!opened)
    return opened.error();
  return std::shared_ptr<storage::block_store>{std::move(*opened)};
}

caf::expected<transport::bulk::options>
node_bulk_options(const config::settings& cfg, const cluster_file& cf,
                  const node_entry& me) {
  auto bopts = transport::bulk::options_from(cfg, me.name);
  if (!bopts)
    return bopts.error();
  bopts->secret = cf.bulk_secret;
  bopts->listen_host = me.host;
  bopts->listen_port = me.bulk_port;
  if (!me.rdma_device.empty())
    bopts->verbs_device = me.rdma_device;
  if (me.gid_index >= 0)
    bopts->verbs_gid_index = me.gid_index;
  if (bopts->backend == "local")
    return bad_input("transport.backend = local cannot reach other "
                     "processes: use auto, tcp or verbs");
  return bopts;
}

namespace {

// The cluster's emulated time origin on this process's actor clock.
emulated_time::time_point local_origin(int64_t origin_unix_ns) {
  auto sys_now =
      duration_cast<nanoseconds>(system_clock::now().time_since_epoch())
          .count();
  return emulated_time::clock_type::now()
         - duration_cast<emulated_time::duration>(
             nanoseconds(sys_now - origin_unix_ns));
}

int64_t unix_now_ns() {
  return duration_cast<nanoseconds>(system_clock::now().time_since_epoch())
      .count();
}

caf::expected<cluster_view> ask_view(caf::actor_system& sys,
                                     const node_supervisor_actor& sup,
                                     caf::timespan patience = seconds(10)) {
  caf::scoped_actor self{sys};
  caf::expected<cluster_view> out{cluster_view{}};
  self->request(sup, patience, view_atom_v)
      .receive([&](cluster_view& v) { out = std::move(v); },
               [&](caf::error& err) { out = std::move(err); });
  return out;
}

const node_info* find_node(const cluster_view& v, const std::string& name) {
  for (auto& n : v.nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

// -- a node's observation -----------------------------------------------------

// What `observe.*` asks of a node process, as `dualpath run` does for its
// embedded cluster (actors/cluster/observe_session.hpp): the /metrics
// endpoint of this process's actors (engines, reader and bulk transport of an
// engine node; the scheduler of the scheduler node), series labelled with
// the deployment's mode, and the timeline of its spans. The timeline is
// written when the node stops, and also whenever spans were recorded and
// none came for a poll period (a job against the deployment ended), so a
// long-running node's file holds every job so far.
class node_observation {
public:
  /// Starts the node's observation and gives the actors of `spec` its
  /// hooks and observer hub.
  static caf::expected<node_observation> make(caf::actor_system& sys,
                                              const config::settings& cfg,
                                              const std::string& node,
                                              cluster::cluster_spec& spec,
                                              std::ostream& log) {
    auto variant = deployment_variant(cfg);
    if (!variant)
      return variant.error();
    auto opts = cluster::observe_options_from(cfg);
    auto session = cluster::observe_session::make(sys, opts);
    if (!session)
      return node_error("observe.metrics_port: cannot serve metrics on "
                        + opts.metrics_address + ":"
                        + std::to_string(opts.metrics_port) + ": "
                        + sys.render(session.error()));
    node_observation out;
    out.session_ = std::move(*session);
    out.hooks_ = out.session_->hooks_for(variant->name);
    out.mode_ = variant->name;
    out.node_ = node;
    out.trace_file_ = opts.trace_file;
    out.log_ = &log;
    if (auto port = out.session_->metrics_port())
      log << "dualpath node " << node << ": metrics at http://"
          << opts.metrics_address << ":" << port << "/metrics" << std::endl;
    spec.hooks = out.hooks_;
    spec.observer = out.session_->hub();
    return out;
  }

  /// The cluster's emulated time, once known (before any actor reports).
  void bind(const emulated_time& time) const {
    hooks_->bind(time);
  }

  /// Exports the byte counters of `node` (storage NIC, DRAM, compute NICs,
  /// bulk transport) until stop().
  void watch(const node_ptr& node, uint32_t byte_scale) {
    watch_ = session_->watch({node}, byte_scale, mode_);
  }

  /// Called about once per period by the waiting thread: writes the
  /// timeline when spans came since the last write and none since the last
  /// poll.
  void poll() {
    auto n = session_->spans();
    if (n != written_ && n == seen_)
      write(n);
    seen_ = n;
  }

  /// The last collection of the watched counters and the final timeline.
  void stop() {
    watch_.reset();
    write(session_->spans());
  }

private:
  void write(size_t spans) {
    if (trace_file_.empty())
      return;
    if (auto err = session_->finish())
      *log_ << "dualpath node " << node_
            << ": observe.trace_file: " << render(err) << std::endl;
    else
      written_ = spans;
  }

  std::unique_ptr<cluster::observe_session> session_;
  std::shared_ptr<cluster::cluster_hooks> hooks_;
  std::shared_ptr<void> watch_;
  std::string mode_;
  std::string node_;
  std::string trace_file_;
  std::ostream* log_ = nullptr;
  size_t written_ = 0; // spans in the file
  size_t seen_ = 0;    // spans at the last poll
};

constexpr auto observe_poll_period = seconds(1);

// The scheduler node as an engine node's agent last saw it.
enum class scheduler_link : uint8_t {
  up,      ///< Its supervisor runs.
  stopped, ///< It was stopped on purpose (SIGTERM/SIGINT: user_shutdown).
  lost,    ///< It died or became unreachable.
};

// Blocks until `stop` is set or `link` is no longer up, polling `obs`
// meanwhile.
void wait_for(const std::atomic<bool>& stop,
              const std::atomic<scheduler_link>& link, node_observation& obs) {
  auto next_poll = steady_clock::now() + observe_poll_period;
  while (!stop.load() && link.load() == scheduler_link::up) {
    std::this_thread::sleep_for(milliseconds(50));
    if (steady_clock::now() >= next_poll) {
      obs.poll();
      next_poll += observe_poll_period;
    }
  }
}

// -- the node agent -----------------------------------------------------------

// Asks a node agent for its storage NIC's counters: (nominal bytes moved so
// far, rate in bytes/s). Builtin types only, so nothing to register.

struct agent_state {
  static inline const char* name = "dualpath.node_agent";
  std::string self_name;
  node_supervisor_actor supervisor;
  std::shared_ptr<transport::bulk::backend> bulk;
  std::vector<caf::actor> engines;
  std::map<std::string, node_info> peers; // by name, as last seen
  std::atomic<scheduler_link>* link = nullptr;
  link_ptr snic;
};

using agent_ptr = caf::stateful_actor<agent_state>*;

void reconcile(agent_ptr self, const cluster_view& v) {
  auto& s = self->state;
  std::map<std::string, const node_info*> now;
  for (auto& n : v.nodes)
    if (n.name != s.self_name)
      now[n.name] = &n;
  // Lost (or restarted) peers: drop their bulk connections and tell the
  // local engines that their actors are gone (a request to an actor of a
  // node lost behind the scheduler node is never answered otherwise).
  for (auto i = s.peers.begin(); i != s.peers.end();) {
    auto j = now.find(i->first);
    bool restarted =
        j != now.end()
        && j->second->endpoint.details != i->second.endpoint.details;
    if (j != now.end() && !restarted) {
      ++i;
      continue;
    }
    aout(self) << "dualpath node " << s.self_name << ": peer " << i->first
               << (restarted ? " restarted" : " lost") << std::endl;
    if (s.bulk)
      s.bulk->drop_peer(i->first);
    for (auto& a : i->second.actors)
      if (a)
        for (auto& e : s.engines)
          caf::anon_send(
              e, caf::down_msg{a.address(),
                               caf::exit_reason::remote_link_unreachable});
    i = s.peers.erase(i);
  }
  // New peers: learn how to reach their bulk endpoints.
  for (auto& [name, info] : now) {
    if (s.peers.count(name) != 0)
      continue;
    if (s.bulk && !info->endpoint.details.empty()) {
      std::vector<uint8_t> details(info->endpoint.details.begin(),
                                   info->endpoint.details.end());
      if (auto err = s.bulk->connect(name, details))
        aout(self) << "dualpath node " << s.self_name
                   << ": cannot reach the bulk endpoint of " << name << ": "
                   << self->system().render(err) << std::endl;
    }
    s.peers.emplace(name, *info);
  }
}

caf::actor spawn_agent(caf::actor_system& sys, agent_state init,
                       const cluster_view& first) {
  return sys.spawn([init, first](agent_ptr self) -> caf::behavior {
    self->state.self_name = init.self_name;
    self->state.supervisor = init.supervisor;
    self->state.bulk = init.bulk;
    self->state.engines = init.engines;
    self->state.link = init.link;
    self->state.snic = init.snic;
    reconcile(self, first);
    self->monitor(self->state.supervisor);
    self->set_down_handler([self](const caf::down_msg& dm) {
      if (dm.source == self->state.supervisor.address()) {
        // A scheduler node stopped on purpose stops the deployment: its
        // engine nodes stop as cleanly as on their own SIGTERM.
        auto stopped = dm.reason == caf::exit_reason::user_shutdown;
        if (stopped)
          aout(self) << "dualpath node " << self->state.self_name
                     << ": the scheduler node stopped; stopping" << std::endl;
        else
          aout(self) << "dualpath node " << self->state.self_name
                     << ": lost the scheduler node (" << to_string(dm.reason)
                     << ")" << std::endl;
        self->state.link->store(stopped ? scheduler_link::stopped
                                        : scheduler_link::lost);
        self->quit();
      }
    });
    self->delayed_send(self, view_period, tick_atom_v);
    return {
        [self](snic_atom) {
          auto& l = self->state.snic;
          return caf::make_message(l ? l->bytes() : uint64_t{0},
                                   l ? l->rate() : uint64_t{0});
        },
        [self](tick_atom) {
          self->request(self->state.supervisor, seconds(5), view_atom_v)
              .then(
                  [self](cluster_view& v) {
                    reconcile(self, v);
                    self->delayed_send(self, view_period, tick_atom_v);
                  },
                  [self](caf::error&) {
                    self->delayed_send(self, view_period, tick_atom_v);
                  });
        },
    };
  });
}

void stop_actor(caf::scoped_actor& self, const caf::actor& hdl) {
  if (!hdl)
    return;
  self->monitor(hdl);
  self->send_exit(hdl, caf::exit_reason::user_shutdown);
  // Its own down message, not another monitored actor's.
  auto until = std::chrono::steady_clock::now() + seconds(5);
  for (bool done = false; !done;) {
    auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    self->receive(
        [&](const caf::down_msg& dm) { done = dm.source == hdl.address(); },
        caf::after(std::max(rest, std::chrono::milliseconds{1})) >>
            [&] { done = true; });
  }
}

// Waits until every node of `view` but the first (this one) has an actor
// down, or `limit` passes.
void await_members(caf::scoped_actor& self, const cluster_view& view,
                   std::chrono::milliseconds limit) {
  std::vector<std::vector<caf::actor_addr>> left;
  for (size_t i = 1; i < view.nodes.size(); ++i) {
    std::vector<caf::actor_addr> addrs;
    for (auto& a : view.nodes[i].actors)
      if (a) {
        self->monitor(a); // down at once for an actor gone already
        addrs.push_back(a.address());
      }
    if (!addrs.empty())
      left.push_back(std::move(addrs));
  }
  auto until = std::chrono::steady_clock::now() + limit;
  while (!left.empty() && std::chrono::steady_clock::now() < until) {
    auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    bool timed_out = false;
    self->receive(
        [&](const caf::down_msg& dm) {
          left.erase(std::remove_if(left.begin(), left.end(),
                                    [&](const auto& addrs) {
                                      return std::find(addrs.begin(),
                                                       addrs.end(), dm.source)
                                             != addrs.end();
                                    }),
                     left.end());
        },
        caf::after(std::max(rest, std::chrono::milliseconds{1})) >>
            [&] { timed_out = true; });
    if (timed_out)
      break;
  }
}

// -- the scheduler node
// --------------------------------------------------------

caf::error run_scheduler_node(const config::settings& cfg,
                              const cluster_file& cf, const node_entry& me,
                              const std::atomic<bool>& stop,
                              std::ostream& log) {
  auto spec = deployment_spec(cfg, cf);
  if (!spec)
    return spec.error();
  auto store = open_store(cfg, *spec, cf.storage_of(me.name));
  if (!store)
    return store.error();
  node_system_config sys_cfg{cfg, cf, log};
  if (sys_cfg.caf_error())
    return sys_cfg.caf_error();
  caf::actor_system sys{sys_cfg};
  auto obs = node_observation::make(sys, cfg, me.name, *spec, log);
  if (!obs)
    return obs.error();
  // The deployment's time origin: this node's start.
  auto origin_ns = unix_now_ns();
  obs->bind(emulated_time{local_origin(origin_ns), spec->time_scale});
  auto sched = spawn_scheduler(
      sys,
      cluster::scheduler_config_for(*spec, cf.names_of(node_role::prefill),
                                    cf.names_of(node_role::decode), *store));
  if (!sched)
    return sched.error();
  auto gate = spawn_submit_gate(sys, *sched, *store, spec->block_tokens);
  node_info self_info;
  self_info.name = me.name;
  self_info.actor_names = {"scheduler", "submit"};
  self_info.actors = {caf::actor_cast<caf::actor>(*sched),
                      caf::actor_cast<caf::actor>(gate)};
  self_info.settings_digest = settings_digest(cfg);
  self_info.settings = deployment_settings(cfg);
  auto sup = spawn_supervisor(sys, self_info, origin_ns);
  auto port = publish_actor(sys, sys_cfg.security(),
                            caf::actor_cast<caf::actor>(sup), me.host, me.port);
  caf::error result;
  if (!port) {
    result =
        node_error("cannot publish the supervisor on " + me.host + ":"
                   + std::to_string(me.port) + ": " + sys.render(port.error()));
  } else {
    log << "dualpath node " << me.name << ": scheduler for "
        << spec->prefill_nodes << "P" << spec->decode_nodes << "D x "
        << spec->gpus_per_node << " GPUs, mode " << to_string(spec->mode)
        << ", listening on " << me.host << ":" << *port << " ("
        << to_string(sys_cfg.security()) << ")" << std::endl;
    std::atomic<scheduler_link> self_link{scheduler_link::up};
    wait_for(stop, self_link, *obs);
    log << "dualpath node " << me.name << ": stopping" << std::endl;
  }
  caf::scoped_actor self{sys};
  // The member nodes learn that the supervisor stopped on purpose (and stop
  // cleanly) from its exit reason, which must leave this process before its
  // connections close: a member that sees the link break first takes it
  // for a lost scheduler node. So the scheduler node waits, up to 5 s,
  // until every member has let go (one of its actors is down) before it
  // stops the rest.
  cluster_view members;
  self->request(sup, seconds(2), view_atom_v)
      .receive([&](cluster_view& v) { members = std::move(v); },
               [](caf::error&) {});
  stop_actor(self, caf::actor_cast<caf::actor>(sup));
  await_members(self, members, std::chrono::seconds(5));
  stop_actor(self, caf::actor_cast<caf::actor>(gate));
  stop_actor(self, caf::actor_cast<caf::actor>(*sched));
  obs->stop();
  return result;
}

// -- prefill and decode nodes -------------------------------------------------

caf::error run_engine_node(const config::settings& cfg, const cluster_file& cf,
                           const node_entry& me, const std::atomic<bool>& stop,
                           std::ostream& log) {
  auto spec = deployment_spec(cfg, cf);
  if (!spec)
    return spec.error();
  // The node's GPUs (gpu.backend, gpu.device, its gpus list), before
  // anything else starts; the choice and each engine's device are logged,
  // every distinct line once.
  auto gpus = cluster::plan_gpus(cfg);
  if (!gpus)
    return gpus.error();
  spec->gpus = *gpus;
  auto seen = std::make_shared<std::pair<std::mutex, std::set<std::string>>>();
  spec->notice = [seen, &log, name = me.name](const std::string& line) {
    std::lock_guard<std::mutex> guard{seen->first};
    if (seen->second.insert(line).second)
      log << "dualpath node " << name << ": " << line << std::endl;
  };
  spec->notice(gpus->reason);
  auto store = open_store(cfg, *spec, cf.storage_of(me.name));
  if (!store)
    return store.error();
  // The bulk transport (transport.backend: verbs, tcp, or auto = verbs per
  // peer where the handshake succeeds, else tcp), authenticated with the
  // cluster's shared secret.
  auto bopts = node_bulk_options(cfg, cf, me);
  if (!bopts)
    return bopts.error();
  // Per-peer choices of `auto` (fallbacks to tcp) go to the node's log.
  bopts->notice = [&log, name = me.name](const std::string& what) {
    log << "dualpath node " + name + ": " + what + "\n" << std::flush;
  };
  auto made = transport::bulk::make_backend(*bopts, nullptr);
  if (!made)
    return made.error();
  auto chosen = std::move(made->reason);
  std::shared_ptr<transport::bulk::backend> bulk{std::move(made->chosen)};
  node_system_config sys_cfg{cfg, cf, log};
  if (sys_cfg.caf_error())
    return sys_cfg.caf_error();
  std::atomic<scheduler_link> link{scheduler_link::up};
  caf::error result;
  {
    caf::actor_system sys{sys_cfg};
    auto obs = node_observation::make(sys, cfg, me.name, *spec, log);
    if (!obs)
      return obs.error();
    auto& sn = cf.scheduler_node();
    auto sup_hdl = connect_actor(sys, sys_cfg.security(), sn.host, sn.port,
                                 connect_patience);
    if (!sup_hdl)
      return node_error("cannot reach the scheduler node " + sn.name + " at "
                        + sn.host + ":" + std::to_string(sn.port) + ": "
                        + sys.render(sup_hdl.error()));
    auto sup = caf::actor_cast<node_supervisor_actor>(*sup_hdl);
    auto view = ask_view(sys, sup);
    if (!view)
      return node_error("no cluster view from " + sn.name + ": "
                        + sys.render(view.error()));
    auto sched_info = find_node(*view, sn.name);
    if (sched_info == nullptr || sched_info->actors.empty())
      return node_error("the scheduler node's view lacks the scheduler");
    auto scheduler = caf::actor_cast<scheduler_actor>(sched_info->actors[0]);
    if (sched_info->settings_digest != settings_digest(cfg))
      return bad_input(
          "this node's settings differ from the scheduler "
          "node's: "
          + settings_difference(deployment_settings(cfg), sched_info->settings,
                                "on this node", "on the scheduler node")
          + ": start every node with the same --config and "
            "--set options");
    emulated_time time{local_origin(view->origin_unix_ns), spec->time_scale};
    obs->bind(time);
    auto role = me.role == node_role::prefill ? engine_role::prefill
                                              : engine_role::decode;
    auto built =
        cluster::build_node(sys, *spec, me.name, role, bulk, *store, time);
    if (!built)
      return built.error();
    obs->watch(built->node, spec->byte_scale);
    auto names = cf.names_of(me.role);
    auto group = static_cast<uint32_t>(
        std::find(names.begin(), names.end(), me.name) - names.begin());
    auto engine = cluster::spawn_node_engine(sys, *spec, built->node, group,
                                             time, scheduler, me.gpus);
    auto engines =
        engine ? caf::expected<std::vector<caf::actor>>{std::vector<caf::actor>{
            *engine}}
               : caf::expected<std::vector<caf::actor>>{engine.error()};
    caf::scoped_actor self{sys};
    caf::actor agent;
    auto regions = std::make_shared<region_directory>();
    bulk_endpoint_actor endpoint;
    if (!engines) {
      result = engines.error();
    } else {
      node_info info;
      info.name = me.name;
      for (uint32_t g = 0; g < spec->gpus_per_node; ++g)
        info.engines.push_back(engine_id{me.name, role, g});
      info.endpoint.node = me.name;
      info.endpoint.backend = bulk->caps().name;
      auto details = bulk->details_for("");
      if (details) {
        info.endpoint.details.assign(details->begin(), details->end());
        info.endpoint.address.assign(details->begin(), details->end());
      }
      // One engine drives the node's GPUs.
      info.actor_names.push_back("engine");
      info.actors.push_back(engines->front());
      info.actor_names.push_back("reader");
      info.actors.push_back(caf::actor_cast<caf::actor>(built->node->reader));
      // The node's bulk endpoint, writing from its buffer pool: what an
      // engine's kv_client asks to push a read's blocks into its pages
      // (actors/client/kv_client.hpp, the DE path of a deployment).
      regions->add(*built->node->pool_registration);
      endpoint = spawn_bulk_endpoint(sys, bulk, regions);
      info.actor_names.push_back("bulk");
      info.actors.push_back(caf::actor_cast<caf::actor>(endpoint));
      // The agent starts before the join (it is part of the node's entry);
      // it learns the joined view with its first poll.
      agent_state init;
      init.self_name = me.name;
      init.supervisor = sup;
      init.bulk = bulk;
      init.engines = *engines;
      init.link = &link;
      init.snic = built->node->snic;
      agent = spawn_agent(sys, init, *view);
      info.actor_names.push_back("agent");
      info.actors.push_back(agent);
      info.settings_digest = settings_digest(cfg);
      info.settings = deployment_settings(cfg);
      std::string address(info.endpoint.address.begin(),
                          info.endpoint.address.end());
      caf::expected<cluster_view> joined{cluster_view{}};
      self->request(sup, seconds(10), join_atom_v, std::move(info))
          .receive([&](cluster_view& v) { joined = std::move(v); },
                   [&](caf::error& err) { joined = std::move(err); });
      if (!joined) {
        result = node_error("the scheduler node refused " + me.name + ": "
                            + sys.render(joined.error()));
      } else {
        caf::anon_send(agent, tick_atom_v);
        log << "dualpath node " << me.name << ": " << engines->size() << " "
            << to_string(role) << " engines joined " << sn.name << " ("
            << to_string(sys_cfg.security()) << "); bulk transport " << chosen
            << " on " << address << std::endl;
        wait_for(stop, link, *obs);
        // Stopped on purpose, a lost scheduler node is no failure (a
        // deployment stopped as a whole loses it on the way).
        if (link.load() == scheduler_link::lost && !stop.load())
          result = node_error("lost the scheduler node " + sn.name);
        else if (link.load() == scheduler_link::up)
          self->send(sup, leave_atom_v, me.name);
      }
      stop_actor(self, agent);
      stop_actor(self, caf::actor_cast<caf::actor>(endpoint));
      if (built->node->pool_registration)
        regions->remove(built->node->pool_registration->id());
      for (auto i = engines->begin(); i != engines->end(); ++i)
        stop_actor(self, *i);
    }
    stop_actor(self, caf::actor_cast<caf::actor>(built->node->reader));
    obs->stop();
    built->node.reset();
    built->keep_alive.clear();
  }
  return result;
}

} // namespace

caf::error run_node(const config::settings& cfg, const cluster_file& cluster,
                    const std::string& name, const std::atomic<bool>& stop,
                    std::ostream& log) {
  auto me = cluster.find(name);
  if (me == nullptr) {
    std::string known;
    for (auto& n : cluster.nodes)
      known += (known.empty() ? "" : ", ") + n.name;
    return bad_input("--name " + name + ": no such node in " + cluster.path
                     + " (nodes: " + known + ")");
  }
  if (me->role == node_role::scheduler)
    return run_scheduler_node(cfg, cluster, *me, stop, log);
  return run_engine_node(cfg, cluster, *me, stop, log);
}

// -- `dualpath run --cluster`
// ---------------------------------------------------

namespace {

// Watches a driven deployment's cluster view during a replay (called from
// replay()'s thread, cluster::replay_options::watch): the job cannot finish
// once the scheduler node stops answering, or once every node of an engine
// role (prefill, decode) has been missing from the view for `grace` (a node
// restarted under its name joins again within it). Without this the driver
// waited for run.wall_limit_s.
class deployment_watch {
public:
  deployment_watch(caf::actor_system& sys, node_supervisor_actor sup,
                   const cluster_file& cf, const cluster_view& first,
                   seconds grace)
      : sys_(sys), sup_(std::move(sup)), cf_(cf), grace_(grace) {
    for (auto role : {node_role::prefill, node_role::decode})
      roles_.push_back(role_watch{role, names_in(first, role), {}});
  }

  /// None while the job can finish, else why it cannot.
  caf::error operator()() {
    auto& sn = cf_.scheduler_node();
    auto v = ask_view(sys_, sup_, seconds(5));
    if (!v)
      return caf::make_error(caf::sec::runtime_error,
                             "lost the scheduler node " + sn.name + " ("
                                 + sn.host + ":" + std::to_string(sn.port)
                                 + "): " + sys_.render(v.error())
                                 + "; the job cannot finish");
    auto now = steady_clock::now();
    for (auto& r : roles_) {
      auto names = names_in(*v, r.role);
      if (!names.empty()) {
        r.last = std::move(names);
        r.gone_since.reset();
        continue;
      }
      if (!r.gone_since)
        r.gone_since = now;
      if (now - *r.gone_since >= grace_)
        return caf::make_error(
            caf::sec::runtime_error,
            "every " + to_string(r.role)
                + " engine left the cluster view (last: " + r.last + ", gone "
                + std::to_string(
                    duration_cast<seconds>(now - *r.gone_since).count())
                + " s; run.role_loss_grace_s = "
                + std::to_string(grace_.count()) + "); the job cannot finish");
    }
    return caf::none;
  }

private:
  struct role_watch {
    node_role role;
    std::string last; // the names of the role's nodes last seen
    std::optional<steady_clock::time_point> gone_since;
  };

  // The names of the nodes of `role` in `v`, comma-separated.
  std::string names_in(const cluster_view& v, node_role role) const {
    std::string out;
    for (auto& n : v.nodes)
      if (auto entry = cf_.find(n.name);
          entry != nullptr && entry->role == role)
        out += (out.empty() ? "" : ", ") + n.name;
    return out;
  }

  caf::actor_system& sys_;
  node_supervisor_actor sup_;
  const cluster_file& cf_;
  seconds grace_;
  std::vector<role_watch> roles_;
};

} // namespace

caf::expected<cluster::job_result>
run_cluster_job(const config::settings& cfg, const cluster_file& cf,
                const cluster::job_options& opts, std::ostream& log) {
  auto wall_start = steady_clock::now();
  auto variant = deployment_variant(cfg);
  if (!variant)
    return variant.error();
  auto spec = deployment_spec(cfg, cf);
  if (!spec)
    return spec.error();
  auto trace = cluster::job_trace(cfg, opts);
  if (!trace)
    return trace.error();
  cluster::job_result result;
  result.bounds = cluster::trace_bounds(*trace, *spec);
  result.byte_scale = spec->byte_scale;
  result.time_scale = spec->time_scale;
  // The trajectories' history goes into the shared store first.
  auto store = open_store(cfg, *spec, cf.storage);
  if (!store)
    return store.error();
  std::vector<std::vector<uint32_t>> histories;
  double prompt_sum = 0;
  double hit_sum = 0;
  for (auto& t : *trace) {
    auto hist = scheduler::workload::history_length(t);
    histories.push_back(scheduler::workload::tokens(t, 0, hist));
    auto first = scheduler::workload::prompt_length(t, t.history_turns);
    prompt_sum += static_cast<double>(first);
    hit_sum += static_cast<double>(hist) / static_cast<double>(first);
    result.requests_per_mode += t.turns.size() - t.history_turns;
  }
  result.agents = trace->size();
  result.mean_prompt_tokens = prompt_sum / static_cast<double>(trace->size());
  result.mean_hit_share = hit_sum / static_cast<double>(trace->size());
  auto pop_start = steady_clock::now();
  auto pop = storage::populate(**store, histories);
  if (!pop)
    return pop.error();
  result.populate_s = duration<double>(steady_clock::now() - pop_start).count();
  result.populated_blocks = pop->written + pop->present;
  // Join the deployment as a client.
  node_system_config sys_cfg{cfg, cf, log};
  if (sys_cfg.caf_error())
    return sys_cfg.caf_error();
  caf::actor_system sys{sys_cfg};
  auto& sn = cf.scheduler_node();
  auto sup_hdl = connect_actor(sys, sys_cfg.security(), sn.host, sn.port,
                               connect_patience);
  if (!sup_hdl)
    return node_error("cannot reach the scheduler node " + sn.name + " at "
                      + sn.host + ":" + std::to_string(sn.port) + ": "
                      + sys.render(sup_hdl.error()));
  auto sup = caf::actor_cast<node_supervisor_actor>(*sup_hdl);
  cluster_view view;
  auto deadline = steady_clock::now() + opts.wall_limit;
  for (;;) {
    auto v = ask_view(sys, sup);
    if (!v)
      return node_error("no cluster view from " + sn.name + ": "
                        + sys.render(v.error()));
    std::string missing;
    for (auto& n : cf.nodes)
      if (find_node(*v, n.name) == nullptr)
        missing += (missing.empty() ? "" : ", ") + n.name;
    if (missing.empty()) {
      view = std::move(*v);
      break;
    }
    if (steady_clock::now() >= deadline)
      return node_error("nodes " + missing + " did not join within "
                        + std::to_string(opts.wall_limit.count()) + " s");
    std::this_thread::sleep_for(milliseconds(100));
  }
  auto sched_info = find_node(view, sn.name);
  if (sched_info->actors.size() < 2)
    return node_error("the scheduler node publishes no submit gate");
  if (sched_info->settings_digest != settings_digest(cfg))
    return bad_input("the deployment runs with other settings than this "
                     "command: "
                     + settings_difference(deployment_settings(cfg),
                                           sched_info->settings, "here",
                                           "on the deployment")
                     + ": give `dualpath run --cluster` the same --config "
                       "and --set options as the nodes");
  auto gate = caf::actor_cast<scheduler_actor>(sched_info->actors[1]);
  // Storage-NIC counters of every engine node, before and after the replay.
  auto snics = [&](const cluster_view& current) {
    std::vector<cluster::snic_usage> out;
    caf::scoped_actor self{sys};
    for (auto& n : current.nodes) {
      auto entry = cf.find(n.name);
      if (entry == nullptr || entry->role == node_role::scheduler)
        continue;
      cluster::snic_usage u;
      u.node = n.name;
      u.role = entry->role == node_role::prefill ? engine_role::prefill
                                                 : engine_role::decode;
      for (size_t i = 0; i < n.actors.size() && i < n.actor_names.size(); ++i)
        if (n.actor_names[i] == "agent")
          self->request(n.actors[i], seconds(5), snic_atom_v)
              .receive(
                  [&](uint64_t bytes, uint64_t rate) {
                    u.bytes = bytes;
                    u.rate_bytes_per_s = rate;
                  },
                  [](caf::error&) {});
      out.push_back(u);
    }
    return out;
  };
  auto snic_before = snics(view);
  cluster::replay_options ro;
  ro.aps = opts.aps;
  ro.seed = static_cast<uint64_t>(cfg.integer("workload.seed"));
  ro.time = emulated_time{local_origin(view.origin_unix_ns), spec->time_scale};
  ro.wall_limit = opts.wall_limit;
  ro.watch = deployment_watch{sys, sup, cf, view,
                              seconds(cfg.integer("run.role_loss_grace_s"))};
  if (opts.progress)
    ro.progress = [&opts, name = variant->name](uint64_t d, uint64_t t,
                                                double emulated_s) {
      opts.progress(cluster::job_progress{cluster::job_progress::phase::replay,
                                          name, d, t, emulated_s});
    };
  // Request ids unique across runs against the same deployment (the
  // scheduler refuses duplicates): seconds since the epoch, shifted.
  auto id_base = ((static_cast<uint64_t>(unix_now_ns()) / 1'000'000'000ull)
                  % (uint64_t{1} << 20))
                     << 24
                 | 1;
  auto outcome = cluster::replay(sys, gate, *trace, ro, id_base);
  if (!outcome)
    return outcome.error();
  // A node lost during the run reports nothing afterwards (0 bytes).
  auto later = ask_view(sys, sup);
  auto snic_after = snics(later ? *later : view);
  for (auto& a : snic_after)
    for (auto& b : snic_before)
      if (a.node == b.node)
        a.bytes -= std::min(a.bytes, b.bytes);
  auto report =
      cluster::summarize(variant->name, *outcome, snic_after, cluster::slo{});
  cluster::set_bound(report, cluster::bound_for(result.bounds, spec->mode));
  for (auto& rec : outcome->records)
    if (rec.result.verify_failures > 0)
      result.failures.push_back(
          cluster::verify_failure{variant->name, rec.result.id, rec.agent,
                                  rec.turn, rec.result.verify_failures});
  result.modes.push_back(std::move(report));
  result.wall_s = duration<double>(steady_clock::now() - wall_start).count();
  return result;
}

} // namespace dualpath::actors::node
