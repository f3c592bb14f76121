#include "actors/cluster/job.hpp"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/cluster/bounds.hpp"
#include "actors/cluster/cluster.hpp"
#include "actors/cluster/observe_session.hpp"
#include "actors/cluster/replay.hpp"
#include "actors/protocol/register.hpp"
#include "actors/sim/driver.hpp"
#include "config/schema.hpp"
#include "scheduler/workload/generator.hpp"
#include "scheduler/workload/trace_file.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/modeled_backend.hpp"

namespace dualpath::actors::cluster {

namespace workload = scheduler::workload;

namespace {

caf::error job_error(const std::string& what) {
  return caf::make_error(caf::sec::runtime_error, what);
}

// A temporary directory removed with everything in it on destruction.
struct scratch_dir {
  std::string path;
  bool owned = false;
  ~scratch_dir() {
    if (owned && !path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

caf::expected<std::string> make_scratch(const std::string& wanted,
                                        scratch_dir& dir) {
  if (!wanted.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(wanted, ec);
    if (ec)
      return job_error("storage.dir: cannot create " + wanted + ": "
                       + ec.message());
    dir.path = wanted;
    return wanted;
  }
  // A RAM-backed tmpfs when there is one: the emulation paces storage on the
  // storage-NIC links, the filesystem only has to hold real, verifiable
  // bytes, and creating ~10^5 small block files on a virtual disk would
  // dominate the run. storage.dir picks any other filesystem.
  std::error_code ec;
  auto base = std::filesystem::temp_directory_path();
  if (std::filesystem::is_directory("/dev/shm", ec)) {
    auto space = std::filesystem::space("/dev/shm", ec);
    if (!ec && space.available > (uint64_t{4} << 30))
      base = "/dev/shm";
  }
  auto tmpl = (base / "dualpath-run-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr)
    return job_error("cannot create a temporary directory from " + tmpl);
  dir.path = buf.data();
  dir.owned = true;
  return dir.path;
}

struct run_config : caf::actor_system_config {
  run_config(const config::settings& cfg, bool simulate) {
    actors::add_message_types(*this);
    set("scheduler.policy",
        caf::atom_from_string(simulate ? std::string{"testing"}
                                       : cfg.string("caf.scheduler_policy")));
    if (cfg.boolean("caf.profiling")) {
      set("scheduler.enable-profiling", true);
      // CAF writes nothing when the file name is empty (it warns "could
      // not open file"): the documented default is caf-profile.txt.
      auto file = cfg.string("caf.profiling_file");
      set("scheduler.profiling-output-file",
          file.empty() ? std::string{"caf-profile.txt"} : file);
      set("scheduler.profiling-resolution",
          caf::timespan{std::chrono::milliseconds(
              cfg.integer("caf.profiling_resolution_ms"))});
    }
    // CAF's own options (its config file, --scheduler.* and the like) over
    // the caf.* keys; load() has checked them.
    caf_error = config::apply(*this, cfg.caf());
    if (simulate) // the deterministic scheduler, whatever CAF was told
      set("scheduler.policy", caf::atom("testing"));
  }

  caf::error caf_error;
};

// Samples every node's storage-NIC bytes while a mode runs.
class snic_sampler {
public:
  snic_sampler(const embedded_cluster& c, caf::actor_system& sys,
               std::chrono::milliseconds period, mode_timeline& out)
      : cluster_(c), sys_(sys), period_(period), out_(out) {
    if (period_.count() > 0)
      thread_ = std::thread([this] { loop(); });
    else
      sample(); // the first state only (simulated time: no thread)
  }

  ~snic_sampler() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
    sample(); // the final state
  }

private:
  void sample() {
    snic_sample s;
    s.t_s =
        static_cast<double>(cluster_.time().since_start_ns(sys_.clock().now()))
        / 1e9;
    for (auto& u : cluster_.snic_usage_now())
      s.bytes.push_back(u.bytes);
    std::lock_guard<std::mutex> guard{mtx_};
    out_.samples.push_back(std::move(s));
  }

  void loop() {
    while (!stop_) {
      sample();
      std::this_thread::sleep_for(period_);
    }
  }

  const embedded_cluster& cluster_;
  caf::actor_system& sys_;
  std::chrono::milliseconds period_;
  mode_timeline& out_;
  std::mutex mtx_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Utilisation of every class of emulated links over `seconds` (see
// link_load).
std::vector<link_load> link_loads(const std::vector<node_ptr>& nodes,
                                  double seconds) {
  struct acc {
    double sum = 0;
    double max = 0;
    size_t n = 0;
  };
  std::map<std::string, acc> by_class;
  auto add = [&](const std::string& cls, const link_ptr& l) {
    if (!l || l->rate() == 0 || seconds <= 0)
      return;
    auto u = static_cast<double>(l->bytes())
             / (static_cast<double>(l->rate()) * seconds);
    auto& a = by_class[cls];
    a.sum += u;
    a.max = std::max(a.max, u);
    ++a.n;
  };
  for (auto& n : nodes) {
    auto side = n->role == engine_role::prefill ? std::string{"pe_"}
                                                : std::string{"de_"};
    for (auto& l : n->cnic_rx)
      add(side + "cnic_read", l);
    for (auto& l : n->cnic_tx)
      add(side + "cnic_write", l);
    add(side + "dram", n->dram);
    add(side + "snic", n->snic);
  }
  std::vector<link_load> out;
  for (auto& [cls, a] : by_class)
    out.push_back(
        link_load{cls, a.n ? a.sum / static_cast<double>(a.n) : 0, a.max});
  return out;
}

} // namespace

caf::expected<std::vector<run_variant>>
parse_variants(const std::string& text) {
  const std::vector<run_variant> known{
      {"basic", load_mode::basic, false},
      {"layerwise", load_mode::layerwise, false},
      {"dualpath-rr", load_mode::dualpath, true},
      {"dualpath", load_mode::dualpath, false},
      {"oracle", load_mode::oracle, false}};
  auto pick = [&](const std::vector<std::string>& names) {
    std::vector<run_variant> out;
    for (auto& n : names)
      for (auto& k : known)
        if (k.name == n)
          out.push_back(k);
    return out;
  };
  if (text == "all")
    return pick({"basic", "dualpath", "oracle"});
  if (text == "ablation")
    return pick({"basic", "layerwise", "dualpath-rr", "dualpath", "oracle"});
  std::vector<run_variant> out;
  size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find(',', start);
    auto item = text.substr(start, end == std::string::npos ? std::string::npos
                                                            : end - start);
    auto found = pick({item});
    if (found.empty()) {
      std::vector<std::string> names{"all", "ablation"};
      for (auto& k : known)
        names.push_back(k.name);
      auto msg = "run.modes: unknown mode '" + item
                 + "' (allowed: all, ablation, or a comma list of basic, "
                   "layerwise, dualpath-rr, dualpath, oracle)";
      if (auto guess = config::suggest(item, names); !guess.empty())
        msg += "; did you mean '" + guess + "'?";
      return caf::make_error(caf::sec::invalid_argument, std::move(msg));
    }
    out.push_back(found.front());
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return out;
}

workload::generator_params generator_params_from(const config::settings& cfg) {
  workload::generator_params p;
  p.turns = static_cast<uint32_t>(cfg.integer("workload.turns"));
  p.append_tokens =
      static_cast<uint32_t>(cfg.integer("workload.append_tokens"));
  p.gen_tokens = static_cast<uint32_t>(cfg.integer("workload.gen_tokens"));
  p.context_tokens =
      static_cast<uint64_t>(cfg.integer("workload.context_tokens"));
  p.max_len = static_cast<uint64_t>(cfg.integer("workload.max_len"));
  p.agents = static_cast<uint32_t>(cfg.integer("workload.agents"));
  p.seed = static_cast<uint64_t>(cfg.integer("workload.seed"));
  return p;
}

caf::expected<workload::trace> job_trace(const config::settings& cfg,
                                         const job_options& opts) {
  auto max_len = static_cast<uint64_t>(cfg.integer("workload.max_len"));
  workload::trace full;
  if (opts.trace_file) {
    auto loaded = workload::load_trace(*opts.trace_file, max_len);
    if (!loaded)
      return loaded.error();
    full = std::move(*loaded);
  } else {
    auto gen = workload::generate(generator_params_from(cfg));
    if (!gen)
      return gen.error();
    full = std::move(*gen);
  }
  workload::trace out;
  // turns = 0, whole trajectories: every turn from the first. Nothing is
  // history except what a trace file states itself (its `history` field,
  // kept as loaded): those turns are in storage by the file's own account.
  if (opts.turns == 0) {
    for (auto& t : full)
      if (t.turns.size() > t.history_turns)
        out.push_back(std::move(t));
    if (out.empty())
      return job_error("the trace has no turn to replay");
    return out;
  }
  // Each trajectory replays `turns` turns from the middle of its own length;
  // what comes before is history that the store holds when replay starts.
  for (auto& t : full) {
    if (t.turns.empty())
      continue;
    auto copy = t;
    auto first = static_cast<uint32_t>(copy.turns.size() / 2);
    first = std::max(first, copy.history_turns);
    if (first >= copy.turns.size())
      first = static_cast<uint32_t>(copy.turns.size() - 1);
    copy.history_turns = first;
    auto end = std::min<size_t>(copy.turns.size(), first + opts.turns);
    copy.turns.resize(end);
    out.push_back(std::move(copy));
  }
  if (out.empty())
    return job_error("the trace has no turn to replay");
  return out;
}

caf::expected<job_result> run_job(const config::settings& cfg,
                                  const job_options& opts) {
  auto wall_start = std::chrono::steady_clock::now();
  job_result result;
  auto trace = job_trace(cfg, opts);
  if (!trace)
    return trace.error();
  // Coarser steps only make sense where no byte is checked.
  if (!opts.simulate && cfg.integer("sim.layers_per_step") != 1)
    return caf::make_error(caf::sec::invalid_argument,
                           "sim.layers_per_step applies to `dualpath sim` "
                           "only (`run` moves and verifies every layer's "
                           "bytes)");
  // -- the block store, pre-populated with every trajectory's history --------
  auto spec0 = spec_from(cfg, load_mode::dualpath);
  if (!spec0)
    return spec0.error();
  result.bounds = trace_bounds(*trace, *spec0);
  // Each distinct operator line once per job (from any thread: engines
  // report host staging when they start).
  auto notices =
      std::make_shared<std::pair<std::mutex, std::set<std::string>>>();
  auto notice = [notices, &result,
                 sink = opts.notice](const std::string& line) {
    // Under the lock: lines arrive from several threads and go to one
    // stream.
    std::lock_guard<std::mutex> guard{notices->first};
    if (!notices->second.insert(line).second)
      return;
    result.notices.push_back(line);
    if (sink)
      sink(line);
  };
  // The GPUs, decided before the store is populated: a `gpu.backend = cuda`
  // without a device fails at once. A simulation moves no byte: host
  // memory, counted only.
  if (opts.simulate) {
    result.gpus.reason = "dualpath sim: HBM is counted, not allocated";
  } else {
    auto plan = plan_gpus(cfg);
    if (!plan)
      return plan.error();
    result.gpus = *plan;
    notice(plan->reason);
  }
  result.byte_scale = spec0->byte_scale;
  result.time_scale = spec0->time_scale;
  scratch_dir dir;
  // A simulation's store is in memory (modeled backend): no directory.
  auto store_dir =
      opts.simulate
          ? caf::expected<std::string>{std::string{"sim-store"}}
          : make_scratch(opts.store_dir.empty() ? cfg.string("storage.dir")
                                                : opts.store_dir,
                         dir);
  if (!store_dir)
    return store_dir.error();
  transport::storage::backend_config bc;
  if (!from_string(cfg.string("storage.backend"), bc.kind))
    return job_error("storage.backend: unknown backend "
                     + cfg.string("storage.backend"));
  bc.queue_depth = static_cast<uint32_t>(cfg.integer("storage.queue_depth"));
  transport::storage::store_config sc;
  sc.model_id = spec0->model.name;
  sc.geometry.layers = spec0->model.layers;
  sc.geometry.block_tokens = spec0->block_tokens;
  sc.geometry.bytes_per_token_layer =
      static_cast<uint32_t>(real_bytes_per_token_layer(*spec0));
  sc.mode = cfg.boolean("storage.o_direct")
                ? transport::storage::io_mode::direct
                : transport::storage::io_mode::buffered;
  sc.sync = cfg.boolean("storage.fsync") ? transport::storage::durability::fsync
                                         : transport::storage::durability::none;
  double prompt_sum = 0;
  double hit_sum = 0;
  for (auto& t : *trace) {
    auto hist = workload::history_length(t);
    auto first_prompt = workload::prompt_length(t, t.history_turns);
    prompt_sum += static_cast<double>(first_prompt);
    hit_sum += static_cast<double>(hist) / static_cast<double>(first_prompt);
    result.requests_per_mode += t.turns.size() - t.history_turns;
  }
  result.agents = trace->size();
  result.mean_prompt_tokens = prompt_sum / static_cast<double>(trace->size());
  result.mean_hit_share = hit_sum / static_cast<double>(trace->size());
  // Every mode starts from the same storage: a store of its own, populated
  // with the histories (blocks persisted by one mode would otherwise be
  // extra hits for the next one).
  auto open_store = [&](const std::string& mode)
      -> caf::expected<std::shared_ptr<transport::storage::block_store>> {
    auto backend =
        opts.simulate ? caf::expected<
            transport::storage::backend_ptr>{transport::storage::
                                                 make_modeled_backend()}
                      : transport::storage::make_backend(bc);
    if (!backend)
      return backend.error();
    auto msc = sc;
    msc.directory = *store_dir + "/" + mode;
    auto opened =
        transport::storage::block_store::open(msc, std::move(*backend));
    if (!opened)
      return opened.error();
    std::shared_ptr<transport::storage::block_store> store{std::move(*opened)};
    // Room for every block the replay can end with (histories, prompts and
    // outputs), so the index never rehashes mid-run.
    uint64_t final_blocks = 0;
    for (auto& t : *trace)
      final_blocks += workload::final_length(t) / sc.geometry.block_tokens;
    store->reserve(final_blocks);
    // One trajectory's history at a time: at 48K agents all histories at
    // once would be ~6 GB of tokens.
    auto pop_start = std::chrono::steady_clock::now();
    uint64_t blocks = 0;
    uint64_t agents_done = 0;
    auto agents = static_cast<uint64_t>(trace->size());
    for (auto& t : *trace) {
      auto pop = transport::storage::populate(
          *store, {workload::tokens(t, 0, workload::history_length(t))});
      if (!pop)
        return pop.error();
      blocks += pop->written + pop->present;
      if (opts.progress)
        opts.progress(job_progress{job_progress::phase::populate, mode,
                                   ++agents_done, agents, 0});
    }
    result.populate_s += std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - pop_start)
                             .count();
    result.populated_blocks = blocks;
    return store;
  };
  // -- the modes
  // ----------------------------------------------------------------
  run_config sys_cfg{cfg, opts.simulate};
  if (sys_cfg.caf_error)
    return std::move(sys_cfg.caf_error);
  caf::actor_system sys{sys_cfg};
  // Simulated time: actors that are still stopping (e.g. linked helpers of
  // the engines) need this thread to run their last jobs before the system
  // may go away, on every return path.
  struct settle_on_exit {
    caf::actor_system& sys;
    ~settle_on_exit() {
      sim::settle(sys);
    }
  } settle_guard{sys};
  // Observation: the observer hub, the metrics endpoint, the timeline.
  auto observe_opts = observe_options_from(cfg);
  if (opts.simulate)
    observe_opts.snapshot_period = std::chrono::milliseconds{0};
  auto observation = observe_session::make(sys, observe_opts);
  if (!observation)
    return observation.error();
  uint64_t id_base = 1;
  for (auto& variant : opts.modes) {
    auto mode = variant.mode;
    auto spec = spec_from(cfg, mode);
    if (spec && variant.round_robin) {
      spec->policy.kind = scheduler::policy_kind::basic;
      spec->policy.reads = scheduler::read_mode::shorter_queue;
    }
    if (!spec)
      return spec.error();
    if (opts.simulate)
      spec->plane = data_plane::modeled;
    else
      spec->gpus = result.gpus;
    spec->notice = notice;
    auto store = open_store(variant.name);
    if (!store)
      return store.error();
    auto setup_start = std::chrono::steady_clock::now();
    auto hooks = (*observation)->hooks_for(variant.name);
    // A simulation without a metrics endpoint or a trace file has nobody to
    // see metrics or spans (no snapshots either): it records none. At
    // 48P96D the label maps of the per-tick load gauges took ~40% of its CPU.
    if (opts.simulate && !(*observation)->observed())
      hooks = nullptr;
    spec->hooks = hooks;
    spec->observer = (*observation)->hub();
    auto cluster = embedded_cluster::make(sys, *spec, *store);
    if (cluster && hooks)
      hooks->bind((*cluster)->time());
    auto watch = cluster ? (*observation)
                               ->watch((*cluster)->nodes(), spec->byte_scale,
                                       variant.name)
                         : nullptr;
    if (!cluster)
      return cluster.error();
    auto setup_s = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - setup_start)
                       .count();
    mode_timeline timeline;
    timeline.mode = variant.name;
    for (auto& u : (*cluster)->snic_usage_now()) {
      timeline.nodes.push_back(u.node);
      timeline.roles.push_back(u.role);
      timeline.rates.push_back(u.rate_bytes_per_s);
    }
    replay_options ro;
    ro.aps = opts.aps;
    ro.seed = static_cast<uint64_t>(cfg.integer("workload.seed"));
    ro.time = (*cluster)->time();
    ro.wall_limit = opts.wall_limit;
    if (opts.progress)
      ro.progress = [&opts, name = timeline.mode](uint64_t d, uint64_t t,
                                                  double emulated_s) {
        opts.progress(
            job_progress{job_progress::phase::replay, name, d, t, emulated_s});
      };
    caf::expected<replay_outcome> outcome{replay_outcome{}};
    auto events_before = sim::events();
    if (opts.simulate) {
      sim::watch(caf::actor_cast<caf::actor>((*cluster)->scheduler()));
      sim::reset_jobs_by_actor();
    }
    {
      snic_sampler sampler{**cluster, sys,
                           opts.simulate ? std::chrono::milliseconds{0}
                                         : opts.sample_period,
                           timeline};
      outcome = replay(sys, (*cluster)->scheduler(), *trace, ro, id_base);
    }
    if (opts.simulate) {
      auto events_after = sim::events();
      result.sim.push_back(sim_mode_stats{
          variant.name, events_after.jobs - events_before.jobs,
          events_after.timeouts - events_before.timeouts,
          outcome ? outcome->wall_s : 0.0, sim::watched_cpu_seconds(),
          sim::watched_wall_seconds(),
          outcome ? link_loads((*cluster)->nodes(),
                               static_cast<double>(outcome->jct_ns) / 1e9)
                  : std::vector<link_load>{},
          sim::jobs_by_actor()});
      sim::watch(caf::actor{});
    }
    if (!outcome)
      return outcome.error();
    id_base += outcome->records.size();
    for (auto t : outcome->agent_done_ns)
      timeline.agent_done_s.push_back(static_cast<double>(t) / 1e9);
    std::sort(timeline.agent_done_s.begin(), timeline.agent_done_s.end());
    for (auto& rec : outcome->records)
      if (!rec.failed)
        timeline.ttft_s.push_back(static_cast<double>(rec.result.ttft_ns)
                                  / 1e9);
    std::sort(timeline.ttft_s.begin(), timeline.ttft_s.end());
    auto report =
        summarize(variant.name, *outcome, (*cluster)->snic_usage_now(), slo{});
    set_bound(report, bound_for(result.bounds, mode));
    for (auto& rec : outcome->records)
      if (rec.result.verify_failures > 0)
        result.failures.push_back(verify_failure{variant.name, rec.result.id,
                                                 rec.agent, rec.turn,
                                                 rec.result.verify_failures});
    auto stop_start = std::chrono::steady_clock::now();
    (*cluster)->shutdown();
    watch.reset();
    report.setup_s = setup_s
                     + std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - stop_start)
                           .count();
    cluster->reset();
    if (dir.owned) {
      // A temporary store goes as soon as its mode is done (it may be GBs).
      auto path = (*store)->config().directory;
      store->reset();
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
    result.modes.push_back(std::move(report));
    result.timelines.push_back(std::move(timeline));
  }
  if (auto err = (*observation)->finish())
    return err;
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now()
                                                - wall_start)
                      .count();
  return result;
}

} // namespace dualpath::actors::cluster
