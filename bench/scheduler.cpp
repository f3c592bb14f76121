// bench_scheduler: CPU cost of the scheduler's placement decisions at the
// paper's largest scale (48P96D: 48 prefill nodes and 96 decode nodes of 8
// GPUs = 1,152 engines in 144 groups) with a realistic waiting queue
// (~7,000 requests with trace-64k-like lengths), in the style of
// LevelDB's db_bench: the named workloads below, several runs each, median
// and spread.
//
// One run emulates `periods` fetch periods of 100 ms in steady state: 2,400
// requests/s arrive (the paper's 48P96D offline load), every prefill group
// leader fetches once per period, every decode group places its pending
// requests, and every engine reports its load (PEs drain tok_e at their
// throughput, node read queues drain at the storage NIC rate, DEs finish
// decodes and free HBM). Timed: everything the scheduler actor would run per
// period (fetch, place, applying the reports); the emulation of engine
// progress is timed too (an upper bound); request generation is not.
// CPU time is the thread's (CLOCK_THREAD_CPUTIME_ID).
//
// Output: one line per workload, then
//   RESULT scheduler cores_at_48p96d=X decisions_per_s=Y
// for the headline workload (dualpath, split reads, every prefill engine a
// candidate in every fetch: the most expensive variant), where
// cores_at_48p96d = 2400 x cpu_seconds_per_decision (target < 0.1) and
// decisions_per_s = 1 / cpu_seconds_per_decision (one core).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "scheduler/cluster_state.hpp"
#include "scheduler/policy.hpp"
#include "scheduler/thresholds.hpp"

using namespace dualpath::scheduler;

namespace {

// -- workloads ----------------------------------------------------------------

enum class scope { all_prefill, fetching_group };

struct workload {
  const char* name;
  policy_kind kind;
  read_mode reads;
  scope candidates;
};

const workload workloads[] = {
    {"dualpath_split_all", policy_kind::dualpath, read_mode::split,
     scope::all_prefill},
    {"dualpath_shorter_all", policy_kind::dualpath, read_mode::shorter_queue,
     scope::all_prefill},
    {"dualpath_split_group", policy_kind::dualpath, read_mode::split,
     scope::fetching_group},
    {"basic_round_robin_all", policy_kind::basic, read_mode::pe_only,
     scope::all_prefill},
};

// -- the 48P96D cluster (DeepSeek-V3.2 660B numbers, brief section 4) ---------

constexpr uint32_t pe_nodes = 48;
constexpr uint32_t de_nodes = 96;
constexpr uint32_t gpus_per_node = 8;
constexpr double kv_bytes_per_token = 40000; // ~40 KB (MLA FP8, 61 layers)
constexpr double snic_bytes_per_s = 50e9;    // 400 Gb/s storage NIC
constexpr double load_rps = 2400;            // paper's 48P96D offline load
constexpr double mean_len = 32721;           // trace 64K mean context
constexpr double period_s = 0.1;             // leader fetch period
constexpr double hbm_for_kv = 60e9;          // per decode GPU
constexpr double decode_s = 176 * 0.036;     // 176 tokens at 36 ms TPOT
constexpr uint32_t append = 429, gen = 176, block = 64;

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

struct run_result {
  uint64_t decisions = 0;
  double cpu_s = 0;
  size_t max_waiting = 0;
  double mean_waiting = 0;
  size_t de_pending = 0; ///< Routed, not yet on a DE, at the end.
};

run_result run_once(const workload& w, uint32_t periods, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double pe_rate = load_rps * mean_len / (pe_nodes * gpus_per_node);
  const double read_rate =
      read_tokens_per_s(snic_bytes_per_s, kv_bytes_per_token);
  thresholds th{derive_alpha(snic_bytes_per_s, kv_bytes_per_token),
                derive_beta(pe_rate)};
  std::vector<node_state> nodes(pe_nodes + de_nodes, node_state{0, read_rate});
  std::vector<engine_state> pes, des;
  std::uniform_real_distribution<double> u01(0, 1);
  for (uint32_t n = 0; n < pe_nodes; ++n)
    for (uint32_t g = 0; g < gpus_per_node; ++g) {
      engine_state e;
      e.id = static_cast<uint32_t>(pes.size());
      e.group = n;
      e.node = n;
      // A busy cluster: every PE holds close to beta (5 s of work).
      e.tok = static_cast<uint64_t>((0.8 + 0.2 * u01(rng)) * th.beta_tokens);
      e.seq = static_cast<uint32_t>(e.tok / mean_len);
      pes.push_back(e);
    }
  for (uint32_t n = 0; n < de_nodes; ++n)
    for (uint32_t g = 0; g < gpus_per_node; ++g) {
      engine_state e;
      e.id = static_cast<uint32_t>(des.size());
      e.group = n;
      e.node = pe_nodes + n;
      e.seq = static_cast<uint32_t>(20 * u01(rng));
      e.tok = static_cast<uint64_t>(e.seq * mean_len);
      e.free_hbm_bytes = static_cast<uint64_t>(
          hbm_for_kv - static_cast<double>(e.tok) * kv_bytes_per_token);
      des.push_back(e);
    }
  auto made =
      cluster_state::make(std::move(pes), std::move(des), std::move(nodes));
  if (!made) {
    std::fprintf(stderr, "bench_scheduler: %s\n",
                 caf::to_string(made.error()).c_str());
    std::exit(1);
  }
  auto st = std::move(*made);
  policy_config cfg;
  cfg.kind = w.kind;
  cfg.reads = w.reads;
  cfg.limits = th;
  auto pol = make_policy(cfg);
  // Trace-64k-like prompts: turns of a trajectory grow from one append to the
  // 64K cap, so lengths are spread roughly uniformly (mean ~32.7K); all but
  // the new append hit in storage (in whole blocks).
  uint64_t next_id = 1;
  auto make_request = [&] {
    request_info r;
    r.id = next_id++;
    r.prompt_tokens = static_cast<uint32_t>(append + u01(rng) * 64000);
    r.hit_blocks = (r.prompt_tokens - append) / block;
    r.hit_tokens = r.hit_blocks * block;
    r.gen_tokens = gen;
    r.kv_bytes_per_token = static_cast<uint32_t>(kv_bytes_per_token);
    return r;
  };
  std::deque<request_info> waiting;
  // Offline load: thousands wait beyond what the engines hold; arrivals
  // match the prefill throughput, so the queue stays in the thousands.
  for (int i = 0; i < 8000; ++i)
    waiting.push_back(make_request());
  std::vector<std::vector<uint32_t>> group_cands(pe_nodes);
  std::vector<uint32_t> all_cands;
  for (uint32_t i = 0; i < st.prefill.size(); ++i) {
    group_cands[st.prefill[i].group].push_back(i);
    all_cands.push_back(i);
  }
  const auto per_period = static_cast<uint32_t>(load_rps * period_s);
  run_result res;
  std::vector<request_info> arrivals(per_period);
  for (uint32_t p = 0; p < periods; ++p) {
    for (auto& r : arrivals) // untimed: the requests' generation
      r = make_request();
    auto t0 = cpu_now();
    waiting.insert(waiting.end(), arrivals.begin(), arrivals.end());
    res.max_waiting = std::max(res.max_waiting, waiting.size());
    res.mean_waiting += static_cast<double>(waiting.size()) / periods;
    for (uint32_t g = 0; g < pe_nodes; ++g) {
      auto out = pol->fetch(
          st, waiting,
          w.candidates == scope::all_prefill ? all_cands : group_cands[g]);
      res.decisions += out.assigned.size();
    }
    for (uint32_t g = 0; g < st.decode_groups.size(); ++g)
      pol->place(st, g);
    // Engine progress over one period, then the reports.
    const double pe_drain = pe_rate * period_s;
    for (uint32_t i = 0; i < st.prefill.size(); ++i) {
      const auto& e = st.prefill[i];
      auto tok = e.tok > pe_drain ? e.tok - static_cast<uint64_t>(pe_drain) : 0;
      auto q = st.nodes[e.node].read_q;
      auto dq = static_cast<uint64_t>(read_rate * period_s / gpus_per_node);
      st.update_prefill(i, static_cast<uint32_t>(tok / mean_len), tok,
                        q > dq ? q - dq : 0);
    }
    const double keep = 1.0 - period_s / decode_s;
    for (uint32_t i = 0; i < st.decode.size(); ++i) {
      const auto& e = st.decode[i];
      auto tok = static_cast<uint64_t>(static_cast<double>(e.tok) * keep);
      auto freed = static_cast<uint64_t>(static_cast<double>(e.tok - tok)
                                         * kv_bytes_per_token);
      auto q = st.nodes[e.node].read_q;
      auto dq = static_cast<uint64_t>(read_rate * period_s / gpus_per_node);
      st.update_decode(i, static_cast<uint32_t>(e.seq * keep), tok,
                       q > dq ? q - dq : 0, e.free_hbm_bytes + freed);
    }
    res.cpu_s += cpu_now() - t0;
  }
  for (const auto& g : st.decode_groups)
    res.de_pending += g.pending.size();
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

} // namespace

int main(int argc, char** argv) {
  uint32_t runs = 5;
  uint32_t periods = 300; // 30 s of emulated time per run
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc)
      runs = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--periods") && i + 1 < argc)
      periods = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_scheduler [--runs N] [--periods N] "
                           "[--only WORKLOAD]\n");
      return 2;
    }
  }
  std::printf("# 48P96D: %u engines in %u groups, %.0f req/s, %u runs x %u "
              "periods of %.0f ms\n",
              (pe_nodes + de_nodes) * gpus_per_node, pe_nodes + de_nodes,
              load_rps, runs, periods, period_s * 1e3);
  std::printf("%-24s %10s %13s %10s %28s %12s %12s\n", "workload", "decisions",
              "waiting_mean", "de_pending", "cpu_us/decision med[min,max]",
              "decisions/s", "cores@48p96d");
  double headline_cores = -1, headline_dps = -1;
  for (const auto& w : workloads) {
    if (only && std::strcmp(only, w.name) != 0)
      continue;
    std::vector<double> us;
    uint64_t decisions = 0;
    size_t max_waiting = 0, de_pending = 0;
    double mean_waiting = 0;
    for (uint32_t r = 0; r < runs; ++r) {
      auto res = run_once(w, periods, 1000 + r);
      if (res.decisions == 0) {
        std::fprintf(stderr, "bench_scheduler: %s made no decision\n", w.name);
        return 1;
      }
      decisions = res.decisions;
      max_waiting = std::max(max_waiting, res.max_waiting);
      mean_waiting = res.mean_waiting;
      de_pending = std::max(de_pending, res.de_pending);
      us.push_back(res.cpu_s / static_cast<double>(res.decisions) * 1e6);
    }
    auto med = median(us);
    auto lo = *std::min_element(us.begin(), us.end());
    auto hi = *std::max_element(us.begin(), us.end());
    double cores = load_rps * med * 1e-6;
    double dps = 1e6 / med;
    std::printf("%-24s %10llu %13.0f %10zu %10.3f [%.3f,%.3f] %12.0f %12.5f\n",
                w.name, static_cast<unsigned long long>(decisions),
                mean_waiting, de_pending, med, lo, hi, dps, cores);
    (void)max_waiting;
    if (headline_cores < 0) {
      headline_cores = cores;
      headline_dps = dps;
    }
  }
  if (headline_cores < 0) {
    std::fprintf(stderr, "bench_scheduler: no workload named %s\n",
                 only ? only : "");
    return 2;
  }
  std::printf("RESULT scheduler cores_at_48p96d=%.5f decisions_per_s=%.0f\n",
              headline_cores, headline_dps);
  return 0;
}
