#include "actors/cluster/cluster.hpp"

#include <cmath>

#include <caf/all.hpp>

#include "actors/engines/decode/decode_engine.hpp"
#include "actors/engines/prefill/prefill_engine.hpp"
#include "actors/placement/global_scheduler.hpp"
#include "actors/sim/driver.hpp"
#include "actors/storage/prefetching_reader.hpp"
#include "actors/storage/storage_reader.hpp"
#include "gpu/device.hpp"
#include "scheduler/thresholds.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/bulk/modeled_backend.hpp"
#include "transport/bulk/tcp_class_policy.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/buffer_pool.hpp"

namespace dualpath::actors::cluster {

namespace {

caf::error bad_config(const std::string& what) {
  return caf::make_error(caf::sec::invalid_argument, what);
}

// "tokens:relative,..." (hardware.prefill_efficiency_curve).
caf::expected<gpu::efficiency_curve> parse_curve(const std::string& text) {
  gpu::efficiency_curve c;
  auto bad = [&](const std::string& why) {
    return bad_config("hardware.prefill_efficiency_curve = \"" + text
                      + "\": " + why
                      + " (expected comma-separated tokens:relative pairs, "
                        "e.g. \"300:0.345,1500:0.862,3000:1\")");
  };
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find(',', start);
    auto item = text.substr(start, end == std::string::npos ? std::string::npos
                                                            : end - start);
    auto colon = item.find(':');
    if (colon == std::string::npos)
      return bad("'" + item + "' has no ':'");
    try {
      size_t used = 0;
      auto tokens = std::stod(item.substr(0, colon), &used);
      if (used != colon)
        return bad("'" + item + "' is not a number pair");
      auto rest = item.substr(colon + 1);
      auto rel = std::stod(rest, &used);
      if (used != rest.size())
        return bad("'" + item + "' is not a number pair");
      c.points.emplace_back(tokens, rel);
    } catch (const std::exception&) {
      return bad("'" + item + "' is not a number pair");
    }
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  if (auto why = gpu::validate(c); !why.empty())
    return bad(why);
  return c;
}

} // namespace

std::function<caf::error()> kv_thread_start(const cluster_spec& spec,
                                            const char* name) {
  transport::bulk::options opts;
  opts.tcp_kv_sched = spec.kv_thread_sched;
  opts.tcp_kv_nice = spec.kv_thread_nice;
  return [opts, name] {
    return transport::bulk::apply_thread_policy(
        opts, transport::traffic_class::kv, name);
  };
}

namespace {

// The device of engine `id` and its CUDA ordinal (-1: host). A modeled data
// plane copies nothing: HBM is only counted. Otherwise the engine's whole
// budget is reserved as one pool slab at once (one region to register for
// RDMA; a machine without the memory fails here, not mid-run).
caf::expected<std::pair<std::shared_ptr<gpu::device>, int>>
engine_device(const cluster_spec& spec, const engine_id& id,
              const std::vector<uint32_t>& node_gpus) {
  gpu::device_options dopts;
  dopts.backend = gpu::backend_choice::host;
  dopts.hbm_budget = std::max<uint64_t>(
      real_bytes(hbm_kv_bytes(spec, id.role), spec.byte_scale), 1);
  dopts.backed = spec.plane == data_plane::real;
  dopts.thread_start = kv_thread_start(spec, "dp-kv-gpu");
  int ordinal = -1;
  if (spec.plane == data_plane::real) {
    dopts.pool_reserve = dopts.hbm_budget;
    if (spec.gpus.kind == gpu::backend_kind::cuda) {
      auto placed = gpu::device_for_rank(id.rank, spec.gpus.first, node_gpus,
                                         spec.gpus.devices);
      if (!placed)
        return bad_config("engine " + id.node + "/" + std::to_string(id.rank)
                          + ": " + gpu::describe(placed.error()));
      ordinal = *placed;
      dopts.backend = gpu::backend_choice::cuda;
      dopts.cuda_device = ordinal;
    }
  }
  auto dev = dopts.backend == gpu::backend_choice::cuda
                 ? gpu::make_cuda_device(dopts)
                 : gpu::make_host_device(dopts);
  if (!dev) {
    auto& err = dev.error();
    auto what = "engine " + id.node + "/" + std::to_string(id.rank)
                + (ordinal >= 0 ? " on CUDA device " + std::to_string(ordinal)
                                : std::string{" (host memory)"})
                + ": " + std::to_string(dopts.hbm_budget)
                + " B of HBM: " + gpu::describe(err);
    if (err.category() == caf::atom("dp_gpu"))
      return caf::make_error(static_cast<gpu::gpu_errc>(err.code()),
                             std::move(what));
    return caf::make_error(caf::sec::runtime_error, std::move(what));
  }
  return std::make_pair(std::move(*dev), ordinal);
}

// Gb/s (network, decimal) to bytes/s.
uint64_t gbps_to_bytes(double gbps) {
  return static_cast<uint64_t>(gbps * 1e9 / 8);
}

} // namespace

caf::expected<gpu_plan> plan_gpus(const config::settings& cfg) {
  auto choice = gpu::parse_backend_choice(cfg.string("gpu.backend"));
  if (!choice)
    return bad_config(gpu::describe(choice.error()));
  gpu_plan plan;
  plan.first = static_cast<int>(cfg.integer("gpu.device"));
  const auto key = "gpu.backend=" + gpu::to_string(*choice);
  if (*choice == gpu::backend_choice::host) {
    plan.reason = key + ": host memory stands in for HBM, as configured";
    return plan;
  }
  auto count = gpu::probe_cuda();
  if (!count) {
    auto why = gpu::describe(count.error());
    if (*choice == gpu::backend_choice::cuda)
      return bad_config("gpu.backend = cuda: " + why);
    plan.reason = key + ": host memory stands in for HBM, because " + why;
    return plan;
  }
  if (plan.first >= *count)
    return bad_config("gpu.device = " + std::to_string(plan.first)
                      + ", but this machine has " + std::to_string(*count)
                      + " CUDA device" + (*count == 1 ? "" : "s")
                      + " (ordinals 0.." + std::to_string(*count - 1) + ")");
  plan.kind = gpu::backend_kind::cuda;
  plan.devices = *count;
  plan.reason = key + ": engine KV in CUDA device memory, "
                + std::to_string(*count) + " device" + (*count == 1 ? "" : "s")
                + " present";
  return plan;
}

uint64_t kv_bytes_per_token(const gpu::model_shape& m) {
  return m.kv_bytes_per_token_layer * m.layers;
}

uint64_t real_bytes_per_token_layer(const cluster_spec& spec) {
  return real_bytes(spec.model.kv_bytes_per_token_layer, spec.byte_scale);
}

double weight_bytes_per_gpu(const cluster_spec& spec, engine_role role) {
  auto nodes =
      role == engine_role::prefill ? spec.prefill_nodes : spec.decode_nodes;
  auto ep = role == engine_role::prefill ? spec.prefill_ep : spec.decode_ep;
  auto gpus = std::max<uint64_t>(
      1, std::min<uint64_t>(ep,
                            uint64_t{nodes} * spec.gpus_per_node * spec.slice));
  return spec.total_params * spec.model.weight_bytes_per_param
         / static_cast<double>(gpus);
}

uint64_t hbm_kv_bytes(const cluster_spec& spec, engine_role role) {
  double left = static_cast<double>(spec.hbm_bytes)
                - weight_bytes_per_gpu(spec, role)
                - static_cast<double>(spec.activation_reserve_bytes);
  return left > 0 ? static_cast<uint64_t>(left) : 0;
}

buffer_slots buffer_slots_of(const cluster_spec& spec, engine_role role) {
  buffer_slots out;
  auto block = uint64_t{spec.block_tokens} * kv_bytes_per_token(spec.model);
  out.slots = static_cast<uint32_t>(
      std::min<uint64_t>(spec.dram_buffer_bytes / std::max<uint64_t>(block, 1),
                         uint64_t{1} << 31));
  if (role == engine_role::prefill) {
    out.read_cap = out.slots;
    return out;
  }
  // The headroom: the longest prompt's blocks (a partial one included) and
  // the decode engine's persist slot.
  auto headroom =
      (spec.max_prompt_tokens + spec.block_tokens - 1) / spec.block_tokens + 2;
  out.read_cap =
      out.slots > headroom ? static_cast<uint32_t>(out.slots - headroom) : 0;
  return out;
}

caf::expected<cluster_spec> spec_from(const config::settings& cfg,
                                      load_mode mode) {
  cluster_spec s;
  s.prefill_nodes = static_cast<uint32_t>(cfg.integer("run.prefill_nodes"));
  s.decode_nodes = static_cast<uint32_t>(cfg.integer("run.decode_nodes"));
  s.gpus_per_node =
      static_cast<uint32_t>(cfg.integer("hardware.gpus_per_node"));
  s.snic_bytes_per_s = gbps_to_bytes(
      cfg.real("hardware.snic_gbps")
      * static_cast<double>(cfg.integer("hardware.snic_per_node")));
  s.cnic_bytes_per_s = gbps_to_bytes(cfg.real("hardware.cnic_gbps"));
  s.dram_bytes_per_s =
      static_cast<uint64_t>(cfg.real("hardware.dram_gbs") * 1e9);
  s.model.name = cfg.string("model.name");
  s.model.layers = static_cast<uint32_t>(cfg.integer("model.layers"));
  s.model.active_params = cfg.real("model.active_params");
  s.model.attention_heads =
      static_cast<uint32_t>(cfg.integer("model.attn_heads"));
  s.model.qk_head_dim = static_cast<uint32_t>(cfg.integer("model.attn_qk_dim"));
  s.model.v_head_dim = static_cast<uint32_t>(cfg.integer("model.attn_v_dim"));
  if (cfg.string("model.attention") == "dsa") {
    s.model.sparse_topk = static_cast<uint32_t>(cfg.integer("model.attn_topk"));
    s.model.indexer_heads =
        static_cast<uint32_t>(cfg.integer("model.indexer_heads"));
    s.model.indexer_dim =
        static_cast<uint32_t>(cfg.integer("model.indexer_dim"));
  }
  s.model.kv_bytes_per_token_layer =
      static_cast<uint64_t>(cfg.integer("model.kv_bytes_per_token_layer"));
  s.model.weight_bytes_per_param = cfg.real("model.weight_bytes_per_param");
  s.gpu.name = cfg.string("hardware.profile");
  s.gpu.tflops = cfg.real("hardware.gpu_tflops");
  s.gpu.compute_efficiency = cfg.real("hardware.gpu_efficiency");
  s.gpu.hbm_tbps = cfg.real("hardware.hbm_tbps");
  s.gpu.hbm_efficiency = cfg.real("hardware.hbm_efficiency");
  s.hbm_bytes =
      static_cast<uint64_t>(cfg.real("hardware.hbm_gib") * double(1ull << 30));
  s.dram_buffer_bytes = static_cast<uint64_t>(
      cfg.real("hardware.dram_buffer_gib") * double(1ull << 30));
  s.block_tokens = static_cast<uint32_t>(cfg.integer("storage.block_tokens"));
  s.byte_scale = static_cast<uint32_t>(cfg.integer("run.byte_scale"));
  if (s.byte_scale == 0) // auto: one real byte per token and layer
    s.byte_scale =
        static_cast<uint32_t>(cfg.integer("model.kv_bytes_per_token_layer"));
  s.time_scale = cfg.real("run.time_scale");
  s.mode = mode;
  s.layer_window = static_cast<uint32_t>(cfg.integer("engines.layer_window"));
  auto curve = parse_curve(cfg.string("hardware.prefill_efficiency_curve"));
  if (!curve)
    return curve.error();
  s.group_model.curve = std::move(*curve);
  s.group_model.routed_share = cfg.real("model.routed_expert_share");
  s.group_model.layer_overhead_s = cfg.real("hardware.layer_overhead_us") / 1e6;
  s.total_params = cfg.real("model.total_params");
  s.slice = static_cast<uint32_t>(cfg.integer("hardware.slice"));
  s.prefill_ep = static_cast<uint32_t>(cfg.integer("engines.prefill_ep"));
  s.decode_ep = static_cast<uint32_t>(cfg.integer("engines.decode_ep"));
  s.activation_reserve_bytes = static_cast<uint64_t>(
      cfg.real("engines.activation_reserve_gib") * double(1ull << 30));
  s.quota_s = static_cast<double>(cfg.integer("scheduler.quota_ms")) / 1e3;
  s.basic_batch_tokens =
      static_cast<uint32_t>(cfg.integer("engines.basic_batch_tokens"));
  s.max_prompt_tokens = static_cast<uint64_t>(cfg.integer("workload.max_len"));
  s.h2d_via_transport = cfg.boolean("gpu.h2d_via_transport");
  s.layers_per_step = static_cast<uint32_t>(cfg.integer("sim.layers_per_step"));
  s.fetch_period_ns = cfg.integer("scheduler.fetch_period_ms") * 1'000'000;
  s.reader_io_threads =
      static_cast<uint32_t>(cfg.integer("storage.io_threads"));
  s.reader_queue_depth =
      static_cast<uint32_t>(cfg.integer("storage.queue_depth"));
  if (auto sched = transport::bulk::kv_sched_from(cfg))
    s.kv_thread_sched = *sched;
  else
    return sched.error();
  s.kv_thread_nice = static_cast<int>(cfg.integer("transport.tcp_kv_nice"));
  s.reader = cfg.string("storage.reader");
  s.prefetch_blocks =
      static_cast<uint32_t>(cfg.integer("storage.prefetch_blocks"));
  if (auto why = gpu::validate(s.model); !why.empty())
    return bad_config("model: " + why);
  if (auto why = gpu::validate(s.gpu); !why.empty())
    return bad_config("hardware: " + why);
  if (auto why = gpu::validate(s.group_model); !why.empty())
    return bad_config("hardware.prefill_efficiency_curve / "
                      "model.routed_expert_share: "
                      + why);
  for (auto role : {engine_role::prefill, engine_role::decode})
    if (hbm_kv_bytes(s, role) == 0)
      return bad_config(
          "no HBM is left for KV on a " + to_string(role)
          + " GPU: " + std::to_string(weight_bytes_per_gpu(s, role) / 1e9)
          + " GB of weights (model.total_params x model.weight_bytes_per_param"
            " / min(engines."
          + (role == engine_role::prefill ? std::string{"prefill_ep"}
                                          : std::string{"decode_ep"})
          + ", the role's GPUs x hardware.slice)) + "
            "engines.activation_reserve_gib exceed "
            "hardware.hbm_gib");
  {
    // A decode node's buffer holds reads and, beside them, the longest
    // prompt's reservation; each side must fit a longest prompt.
    auto bs = buffer_slots_of(s, engine_role::decode);
    auto longest = static_cast<uint32_t>(
        (s.max_prompt_tokens + s.block_tokens - 1) / s.block_tokens);
    if (bs.read_cap < longest)
      return bad_config("hardware.dram_buffer_gib: a decode node's buffer of "
                        + std::to_string(bs.slots)
                        + " Full Blocks cannot hold two prompts of "
                        + "workload.max_len = "
                        + std::to_string(s.max_prompt_tokens) + " tokens ("
                        + std::to_string(longest) + " blocks each)");
  }
  // Policy: Basic and layerwise-only place round robin and read on the PE
  // side; DualPath runs the paper's scheduler (split reads unless disabled);
  // Oracle places like DualPath but moves no bytes.
  auto kvpt = static_cast<double>(kv_bytes_per_token(s.model));
  s.policy.limits.alpha_tokens =
      scheduler::derive_alpha(static_cast<double>(s.snic_bytes_per_s), kvpt,
                              cfg.real("scheduler.alpha_s"));
  // beta = prompt tokens one GPU gets through in beta_s: a typical request
  // of the workload (context_tokens long, append_tokens of it new) takes
  // t_req on one GPU by the compute model, so beta = beta_s / t_req x its
  // length (tok_e counts whole prompts, cached tokens included).
  auto context = static_cast<uint64_t>(cfg.integer("workload.context_tokens"));
  auto append = std::min<uint64_t>(
      context, static_cast<uint64_t>(cfg.integer("workload.append_tokens")));
  auto t_req =
      gpu::prefill_layer_seconds(
          s.model, s.gpu, {gpu::sequence_shape{context - append, append}})
      * s.model.layers;
  auto tokens_per_s = t_req > 0 ? static_cast<double>(context) / t_req : 1e9;
  s.policy.limits.beta_tokens =
      scheduler::derive_beta(tokens_per_s, cfg.real("scheduler.beta_s"));
  s.policy.de_headroom = cfg.real("scheduler.de_headroom");
  switch (mode) {
    case load_mode::basic:
    case load_mode::layerwise:
      s.policy.kind = scheduler::policy_kind::basic;
      s.policy.reads = scheduler::read_mode::pe_only;
      break;
    case load_mode::dualpath:
    case load_mode::oracle:
      s.policy.kind = scheduler::policy_kind::dualpath;
      s.policy.reads = cfg.boolean("scheduler.split_reads")
                           ? scheduler::read_mode::split
                           : scheduler::read_mode::shorter_queue;
      break;
  }
  return s;
}

embedded_cluster::embedded_cluster(caf::actor_system& sys, cluster_spec spec)
    : sys_(sys), spec_(std::move(spec)) {
  // nop
}

embedded_cluster::~embedded_cluster() {
  shutdown();
}

void embedded_cluster::shutdown() {
  if (stopped_)
    return;
  stopped_ = true;
  caf::scoped_actor self{sys_};
  auto stop = [&](const caf::actor& hdl) {
    if (!hdl)
      return;
    self->monitor(hdl);
    self->send_exit(hdl, caf::exit_reason::user_shutdown);
    sim::settle(sys_); // simulated time: the actor stops now
    self->receive([](const caf::down_msg&) {});
  };
  // Engines first (they use readers and the scheduler), then the scheduler,
  // then readers; resources die with the nodes afterwards.
  for (auto i = actors_.rbegin(); i != actors_.rend(); ++i)
    stop(*i);
  stop(caf::actor_cast<caf::actor>(scheduler_));
  for (auto& n : nodes_)
    stop(caf::actor_cast<caf::actor>(n->reader));
  actors_.clear();
  // Registrations before the bulk backends that own them (nodes_).
  keep_alive_.clear();
  nodes_.clear();
}

std::vector<snic_usage> embedded_cluster::snic_usage_now() const {
  std::vector<snic_usage> out;
  for (auto& n : nodes_)
    out.push_back(
        snic_usage{n->name, n->role, n->snic->bytes(), n->snic->rate()});
  return out;
}

caf::expected<built_node>
build_node(caf::actor_system& sys, const cluster_spec& spec,
           const std::string& name, engine_role role,
           std::shared_ptr<transport::bulk::backend> bulk,
           std::shared_ptr<transport::storage::block_store> store,
           const emulated_time& time) {
  if (!store || !bulk)
    return bad_config("node " + name
                      + " needs a block store and a bulk "
                        "backend");
  auto file_bytes = store->geometry().file_bytes();
  built_node out;
  auto node = std::make_shared<node_resources>();
  node->role = role;
  node->name = name;
  node->snic = std::make_shared<emulated_link>(node->name + ".snic",
                                               spec.snic_bytes_per_s);
  node->dram = std::make_shared<emulated_link>(node->name + ".dram",
                                               spec.dram_bytes_per_s);
  for (uint32_t g = 0; g < spec.gpus_per_node; ++g) {
    auto gpu = node->name + ".cnic" + std::to_string(g);
    node->cnic_rx.push_back(
        std::make_shared<emulated_link>(gpu + ".rx", spec.cnic_bytes_per_s));
    node->cnic_tx.push_back(
        std::make_shared<emulated_link>(gpu + ".tx", spec.cnic_bytes_per_s));
  }
  node->bulk = std::move(bulk);
  node->store = store;
  node->loads = std::make_shared<load_board>();
  // The node's DRAM buffer (dram_buffer_bytes nominal, one slot per Full
  // Block): the reader's pool, registered once with the bulk transport.
  auto slots = buffer_slots_of(spec, role);
  if (slots.slots == 0)
    return bad_config("hardware.dram_buffer_gib: node " + name
                      + "'s buffer holds no Full Block");
  auto pool = transport::storage::buffer_pool::make(
      uint64_t{slots.slots} * file_bytes, file_bytes);
  if (!pool)
    return pool.error();
  auto reg = node->bulk->register_region((*pool)->base(), (*pool)->size());
  if (!reg)
    return reg.error();
  auto registration =
      std::make_shared<transport::bulk::local_registration>(std::move(*reg));
  node->pool = *pool;
  node->pool_registration = registration.get();
  storage_reader_config rc;
  rc.node = node->name;
  rc.region_id = registration->id();
  rc.region_key = registration->describe().key;
  rc.read_cap = slots.read_cap;
  rc.store = store;
  rc.pool = *pool;
  // A modeled data plane reads inline (no I/O threads: one thread runs a
  // simulation) and only checks that the blocks exist.
  rc.io_threads =
      spec.plane == data_plane::modeled ? 0 : spec.reader_io_threads;
  rc.modeled_reads = spec.plane == data_plane::modeled;
  rc.io_thread_start = kv_thread_start(spec, "dp-kv-io");
  // One lease per run of blocks (the prefetching reader keeps single ones).
  rc.lease_runs = rc.modeled_reads && spec.reader != "prefetching";
  rc.max_inflight = spec.reader_queue_depth;
  // Pacing in emulated time: nominal bytes on the node's storage NIC.
  rc.pace = [link = node->snic, time, scale = spec.byte_scale](
                uint64_t bytes, emulated_time::time_point now) {
    auto emu_now = time.to_emulated(now);
    auto done = link->reserve(bytes * scale, emu_now);
    return now + time.to_actor(done - emu_now);
  };
  // Persist sources are regions of this node (a decode engine's DRAM
  // buffer) in this process; anything else is refused.
  rc.resolve = [name = node->name](
                   const remote_region& r) -> caf::expected<const std::byte*> {
    if (r.node != name)
      return caf::make_error(caf::sec::invalid_argument,
                             "persist source of node " + r.node
                                 + " is not local to " + name);
    return reinterpret_cast<const std::byte*>(r.base) + r.offset;
  };
  rc.hooks = spec.hooks;
  rc.on_queue = [board = node->loads](const read_queue_status& q) {
    board->publish_read_queue(q);
  };
  auto reader = spawn_storage_reader(sys, std::move(rc));
  if (!reader)
    return reader.error();
  node->reader = *reader;
  if (spec.reader == "prefetching") {
    // The extension example in front of the node's reader; it keeps at most
    // a quarter of the pool, so ordinary reads always find room.
    prefetch_config pc;
    pc.node = node->name;
    pc.max_blocks = std::max<uint32_t>(
        1, std::min<uint32_t>(spec.prefetch_blocks,
                              static_cast<uint32_t>(slots.read_cap / 4)));
    pc.observer = spec.observer;
    node->reader = spawn_prefetching_reader(sys, *reader, std::move(pc));
  }
  out.keep_alive.push_back(std::move(registration));
  out.keep_alive.push_back(*pool);
  out.node = std::move(node);
  return out;
}

scheduler_config
scheduler_config_for(const cluster_spec& spec,
                     const std::vector<std::string>& prefill_names,
                     const std::vector<std::string>& decode_names,
                     std::shared_ptr<transport::storage::block_store> store) {
  scheduler_config sched;
  sched.policy = spec.policy;
  sched.block_tokens = spec.block_tokens;
  sched.kv_bytes_per_token = kv_bytes_per_token(spec.model);
  sched.store = std::move(store);
  sched.hooks = spec.hooks;
  sched.observer = spec.observer;
  auto read_tokens_per_s = static_cast<double>(spec.snic_bytes_per_s)
                           / static_cast<double>(sched.kv_bytes_per_token);
  auto add = [&](const std::string& name, engine_role role, uint32_t group,
                 uint32_t node) {
    sched.nodes.push_back(scheduler::node_state{0, read_tokens_per_s});
    for (uint32_t g = 0; g < spec.gpus_per_node; ++g) {
      scheduled_engine e;
      e.id = engine_id{name, role, g};
      e.node = node;
      e.group = group;
      (role == engine_role::prefill ? sched.prefill : sched.decode)
          .push_back(e);
    }
  };
  uint32_t n = 0;
  for (uint32_t i = 0; i < prefill_names.size(); ++i)
    add(prefill_names[i], engine_role::prefill, i, n++);
  for (uint32_t i = 0; i < decode_names.size(); ++i)
    add(decode_names[i], engine_role::decode, i, n++);
  return sched;
}

engine_config engine_config_for(const cluster_spec& spec, const node_ptr& node,
                                uint32_t group, const emulated_time& time,
                                const scheduler_actor& scheduler) {
  engine_config ec;
  ec.role = node->role;
  ec.group = group;
  ec.gpus = spec.gpus_per_node;
  ec.mode = spec.mode;
  // The compute quota is the scheduler's (its intra-engine part): the modes
  // it runs in pack by quota, the others FIFO under a token budget.
  ec.packing = spec.policy.kind == scheduler::policy_kind::dualpath
                   ? batching::quota
                   : batching::token_budget;
  ec.layer_window = spec.layer_window;
  ec.model.layers = spec.model.layers;
  ec.model.block_tokens = spec.block_tokens;
  ec.model.nominal_bytes_per_token_layer = spec.model.kv_bytes_per_token_layer;
  ec.model.real_bytes_per_token_layer = real_bytes_per_token_layer(spec);
  ec.model.active_params = spec.model.active_params;
  ec.model.attn_heads = spec.model.attention_heads;
  ec.model.attn_qk_dim = spec.model.qk_head_dim;
  ec.model.attn_v_dim = spec.model.v_head_dim;
  ec.model.attn_topk = spec.model.sparse_topk;
  ec.model.indexer_heads = spec.model.indexer_heads;
  ec.model.indexer_dim = spec.model.indexer_dim;
  if (spec.plane == data_plane::modeled)
    ec.model = coarsen(ec.model, spec.layers_per_step, spec.byte_scale);
  ec.time = time;
  ec.byte_scale = spec.byte_scale;
  ec.node = node;
  ec.gpu = spec.gpu;
  ec.group_model = spec.group_model;
  ec.group_model.weight_bytes_per_gpu = weight_bytes_per_gpu(spec, node->role);
  ec.hbm_kv_bytes = hbm_kv_bytes(spec, node->role);
  ec.quota_s = spec.quota_s;
  ec.batch_tokens = spec.basic_batch_tokens;
  ec.fetch_period_ns = spec.fetch_period_ns;
  ec.verify_kv = spec.plane == data_plane::real;
  ec.real_bytes = spec.plane == data_plane::real;
  ec.h2d_via_transport = spec.h2d_via_transport;
  ec.scheduler = caf::actor_cast<caf::actor>(scheduler);
  ec.hooks = spec.hooks;
  ec.observer = spec.observer;
  ec.notice = spec.notice;
  return ec;
}

caf::expected<caf::actor>
spawn_node_engine(caf::actor_system& sys, const cluster_spec& spec,
                  const node_ptr& node, uint32_t group,
                  const emulated_time& time, const scheduler_actor& scheduler,
                  const std::vector<uint32_t>& node_gpus) {
  auto ec = engine_config_for(spec, node, group, time, scheduler);
  std::string placed; // "0 -> 0, 1 -> 1" (rank -> CUDA device)
  std::string device_name;
  for (uint32_t g = 0; g < spec.gpus_per_node; ++g) {
    auto dev = engine_device(spec, ec.id_of(g), node_gpus);
    if (!dev)
      return dev.error();
    if (spec.gpus.kind == gpu::backend_kind::cuda
        && spec.plane == data_plane::real) {
      placed += (placed.empty() ? "" : ", ") + std::to_string(g) + " -> "
                + std::to_string(dev->second);
      device_name = dev->first->capabilities().name;
    }
    ec.devices.push_back(std::move(dev->first));
  }
  if (!placed.empty() && spec.notice)
    spec.notice(
        (node_gpus.empty() ? std::string{} : "node " + node->name + ": ")
        + "engine rank -> CUDA device: " + placed + " (" + device_name
        + (node_gpus.empty() ? ", device = (gpu.device + rank) mod "
                                   + std::to_string(spec.gpus.devices)
                             : std::string{", the node's gpus list"})
        + ")");
  caf::actor hdl;
  if (node->role == engine_role::prefill)
    hdl = caf::actor_cast<caf::actor>(spawn_prefill_engine(sys, ec));
  else
    hdl = caf::actor_cast<caf::actor>(spawn_decode_engine(sys, ec));
  caf::scoped_actor self{sys};
  // An engine sets itself up (streams and their threads, staging, its
  // layer streamer) before it handles a message: its answer to a status
  // query says it runs. One that stopped instead is not enrolled; the
  // error says why it stopped.
  self->monitor(hdl);
  caf::error down;
  bool up = false;
  auto probe = self->request(hdl, std::chrono::seconds(10), status_atom_v);
  sim::settle(sys); // simulated time: the engine answers now
  probe.receive([&](group_report&) { up = true; },
                [&](caf::error& err) { down = std::move(err); });
  if (!up) {
    self->receive([&](caf::down_msg& dm) { down = std::move(dm.reason); },
                  caf::after(std::chrono::seconds(1)) >> [] {});
    self->send_exit(hdl, caf::exit_reason::user_shutdown);
    return caf::make_error(caf::sec::runtime_error,
                           to_string(node->role) + " engine of node "
                               + node->name
                               + " did not start: " + sys.render(down));
  }
  self->demonitor(hdl);
  for (uint32_t g = 0; g < spec.gpus_per_node; ++g) {
    bool enrolled = false;
    auto id = ec.id_of(g);
    auto pending = self->request(
        scheduler, std::chrono::seconds(10), enroll_atom_v,
        engine_registration{id, ec.group, hdl,
                            node->role == engine_role::decode ? ec.hbm_kv_bytes
                                                              : 0});
    sim::settle(sys); // simulated time: the scheduler answers now
    pending.receive([&](bool ok) { enrolled = ok; },
                    [&](caf::error&) { enrolled = false; });
    if (!enrolled) {
      self->send_exit(hdl, caf::exit_reason::user_shutdown);
      return bad_config("engine " + id.node + "/" + std::to_string(id.rank)
                        + " could not enroll with the scheduler");
    }
  }
  return hdl;
}

caf::expected<std::unique_ptr<embedded_cluster>>
embedded_cluster::make(caf::actor_system& sys, const cluster_spec& spec,
                       std::shared_ptr<transport::storage::block_store> store) {
  if (!store)
    return bad_config("embedded cluster needs a block store");
  std::unique_ptr<embedded_cluster> c{new embedded_cluster(sys, spec)};
  c->time_ = emulated_time{sys.clock().now(), spec.time_scale};
  auto fabric = transport::bulk::make_local_fabric();
  auto modeled_fabric = transport::bulk::make_modeled_fabric();
  // -- nodes
  // -------------------------------------------------------------------
  std::vector<std::string> pe_names;
  std::vector<std::string> de_names;
  auto total_nodes = spec.prefill_nodes + spec.decode_nodes;
  for (uint32_t n = 0; n < total_nodes; ++n) {
    auto role =
        n < spec.prefill_nodes ? engine_role::prefill : engine_role::decode;
    auto name = role == engine_role::prefill
                    ? "pe" + std::to_string(n)
                    : "de" + std::to_string(n - spec.prefill_nodes);
    (role == engine_role::prefill ? pe_names : de_names).push_back(name);
    transport::bulk::options bopts;
    bopts.backend = "local";
    bopts.node = name;
    auto bulk =
        spec.plane == data_plane::modeled
            ? transport::bulk::make_modeled_backend(bopts, modeled_fabric)
            : transport::bulk::make_local_backend(bopts, fabric);
    if (!bulk)
      return bulk.error();
    auto built =
        build_node(sys, spec, name, role,
                   std::shared_ptr<transport::bulk::backend>(std::move(*bulk)),
                   store, c->time_);
    if (!built)
      return built.error();
    for (auto& k : built->keep_alive)
      c->keep_alive_.push_back(std::move(k));
    c->nodes_.push_back(std::move(built->node));
  }
  // -- engines and scheduler
  // ------------------------------------------------------
  auto scheduler = spawn_scheduler(
      sys, scheduler_config_for(spec, pe_names, de_names, store));
  if (!scheduler)
    return scheduler.error();
  c->scheduler_ = *scheduler;
  for (uint32_t n = 0; n < total_nodes; ++n) {
    auto& node = c->nodes_[n];
    auto group =
        node->role == engine_role::prefill ? n : n - spec.prefill_nodes;
    auto engine =
        spawn_node_engine(sys, spec, node, group, c->time_, c->scheduler_);
    if (!engine)
      return engine.error();
    c->actors_.push_back(*engine);
  }
  return c;
}

} // namespace dualpath::actors::cluster
