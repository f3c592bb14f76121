#include "actors/observe/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace dualpath::actors::observe {

namespace {

// dualpath's standard families. Byte counts are nominal (the emulated
// hardware's bytes, not the byte-scaled real copies); times are emulated.
// Every series recorded by a cluster's actors carries `mode` (the cluster's
// mode: basic, dualpath, ...), since one process runs the modes one after
// another; docs/observability.md lists each family's labels.
std::vector<family_spec> standard_families() {
  using k = metric_kind;
  return {
      {"dualpath_read_queue_tokens",
       k::gauge,
       "Tokens of storage reads queued or in flight at a node's storage "
       "reader (read_q).",
       {}},
      {"dualpath_read_queue_bytes",
       k::gauge,
       "Full Block bytes (nominal) of storage reads queued or in flight at a "
       "node's storage reader.",
       {}},
      {"dualpath_reader_buffer_used_bytes",
       k::gauge,
       "Bytes of a node's storage-reader DRAM pool held by leases (real "
       "bytes: byte-scaled in an emulated run).",
       {}},
      {"dualpath_reader_buffer_waits_total",
       k::counter,
       "Storage reads and slot reservations that waited for room in a node's "
       "DRAM buffer (counted once each).",
       {}},
      {"dualpath_reader_leases_reclaimed_total",
       k::counter,
       "Leases a storage reader freed itself because their holder (a client "
       "in another process) went down before releasing them.",
       {}},
      {"dualpath_snic_bytes_total",
       k::counter,
       "Nominal bytes moved over a node's storage NIC (reads and persists).",
       {}},
      {"dualpath_cnic_bytes_total",
       k::counter,
       "Nominal bytes moved over one compute NIC (label nic) in one direction "
       "(label direction: rx or tx).",
       {}},
      {"dualpath_dram_bytes_total",
       k::counter,
       "Nominal bytes moved through a node's DRAM.",
       {}},
      {"dualpath_bulk_bytes_total",
       k::counter,
       "Nominal bytes a node's bulk transport sent, per traffic class (label "
       "class: control or kv).",
       {}},
      {"dualpath_storage_blocks_read_total",
       k::counter,
       "Full Blocks a node's storage reader leased.",
       {}},
      {"dualpath_storage_blocks_persisted_total",
       k::counter,
       "Full Blocks a node's storage reader persisted.",
       {}},
      {"dualpath_requests_submitted_total",
       k::counter,
       "Requests submitted to the scheduler.",
       {}},
      {"dualpath_requests_completed_total",
       k::counter,
       "Requests completed (decoded and persisted).",
       {}},
      {"dualpath_prefill_layers_total",
       k::counter,
       "Layers computed by prefill engines (one per layer per batch).",
       {}},
      {"dualpath_ttft_seconds", k::histogram,
       "Time to first token (emulated), arrival to the end of prefill.",
       seconds_buckets()},
      {"dualpath_tpot_seconds", k::histogram,
       "Mean time per output token after the first (emulated).",
       seconds_buckets()},
      {"dualpath_control_rtt_seconds",
       k::histogram,
       "Round trip of a control message (label message: fetch, a prefill "
       "engine's fetch to the global scheduler and its reply), wall time "
       "on the sender's actor clock.",
       {50e-6, 100e-6, 250e-6, 500e-6, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
        0.1, 0.25, 1}},
      {"dualpath_engine_requests",
       k::gauge,
       "Unfinished requests of an engine (seq_e), as last reported.",
       {}},
      {"dualpath_engine_tokens",
       k::gauge,
       "Tokens of an engine's unfinished requests (tok_e), as last reported.",
       {}},
      {"dualpath_engine_free_hbm_bytes",
       k::gauge,
       "Free GPU memory (nominal) of a decode engine, as last reported.",
       {}},
      {"dualpath_errors_total",
       k::counter,
       "Errors, by the component that saw them (label source) and what "
       "failed (label kind: read, persist, verify, stream; error events of "
       "other actors have source only).",
       {}},
      {"dualpath_reroutes_total",
       k::counter,
       "Requests the scheduler re-queued to another engine after theirs "
       "failed.",
       {}},
      {"dualpath_bulk_tcp_fallback_total",
       k::counter,
       "Peers a node's bulk transport reaches over tcp although "
       "transport.backend = auto wanted verbs (no RDMA device, or the verbs "
       "handshake with that peer failed).",
       {}},
      {"dualpath_prefetch_blocks_total",
       k::counter,
       "Full Blocks the prefetching reader read ahead into DRAM (label "
       "source: prefetch.<node>).",
       {}},
      {"dualpath_prefetch_hits_total",
       k::counter,
       "Blocks of a turn's reads that the prefetching reader already held.",
       {}},
      {"dualpath_prefetch_misses_total",
       k::counter,
       "Blocks of a turn's reads that the prefetching reader did not hold "
       "(read as usual).",
       {}},
      {"dualpath_prefetch_evicted_total",
       k::counter,
       "Prefetched blocks the prefetching reader dropped unused to stay "
       "within storage.prefetch_blocks.",
       {}},
      {"dualpath_prefetch_kept_blocks",
       k::gauge,
       "Prefetched blocks the prefetching reader holds now.",
       {}},
      {"dualpath_gpu_staged_bytes_total",
       k::counter,
       "Bytes pushed for a prefill engine's GPU memory that were staged "
       "through host memory and copied in, because its GPU memory is not "
       "registered for RDMA (no dma-buf export, or a bulk transport that "
       "registers host memory only).",
       {}},
  };
}

void write_labels(std::ostringstream& out, const label_set& labels,
                  const std::string& le = {}) {
  if (labels.empty() && le.empty())
    return;
  out << '{';
  bool first = true;
  for (auto& [k, v] : labels) {
    out << (first ? "" : ",") << k << "=\"" << escape_label_value(v) << '"';
    first = false;
  }
  if (!le.empty())
    out << (first ? "" : ",") << "le=\"" << le << '"';
  out << '}';
}

std::string escape_help(const std::string& x) {
  std::string out;
  for (auto c : x) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

const char* type_name(metric_kind k) {
  switch (k) {
    case metric_kind::counter:
      return "counter";
    case metric_kind::gauge:
      return "gauge";
    case metric_kind::histogram:
      return "histogram";
  }
  return "untyped";
}

} // namespace

std::vector<double> seconds_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
          0.5,   1,      2.5,   5,    10,    30,   60};
}

std::string escape_label_value(const std::string& x) {
  std::string out;
  for (auto c : x) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double x) {
  if (std::isnan(x))
    return "NaN";
  if (std::isinf(x))
    return x > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (x == std::floor(x) && std::fabs(x) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", x);
    return buf;
  }
  // The shortest precision that reads back as the same double.
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x)
      break;
  }
  return buf;
}

metrics_registry::metrics_registry() {
  for (auto& f : standard_families())
    declare(std::move(f));
}

void metrics_registry::declare(family_spec spec) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (spec.kind == metric_kind::histogram && spec.buckets.empty())
    spec.buckets = seconds_buckets();
  std::sort(spec.buckets.begin(), spec.buckets.end());
  auto i = index_.find(spec.name);
  if (i != index_.end()) {
    auto& f = families_[i->second];
    auto same_shape =
        f.spec.kind == spec.kind && f.spec.buckets == spec.buckets;
    f.spec = std::move(spec);
    if (!same_shape)
      f.series_by_labels.clear();
    return;
  }
  index_.emplace(spec.name, families_.size());
  families_.push_back(family{std::move(spec), {}});
}

metrics_registry::family& metrics_registry::family_of(const std::string& name,
                                                      metric_kind kind) {
  auto i = index_.find(name);
  if (i != index_.end())
    return families_[i->second];
  // First use of an undeclared family (an extension's snapshot sample, see
  // docs/extending.md): a name ending in _total is a counter.
  if (kind == metric_kind::gauge && name.size() > 6
      && name.compare(name.size() - 6, 6, "_total") == 0)
    kind = metric_kind::counter;
  family_spec spec{name,
                   kind,
                   "Reported by an actor in its state snapshots; not "
                   "declared by dualpath (see docs/extending.md).",
                   {}};
  if (kind == metric_kind::histogram)
    spec.buckets = seconds_buckets();
  index_.emplace(name, families_.size());
  families_.push_back(family{std::move(spec), {}});
  return families_.back();
}

void metrics_registry::add(const std::string& name, const label_set& labels,
                           double delta) {
  if (!(delta >= 0))
    return; // counters never go down
  std::lock_guard<std::mutex> guard{mtx_};
  family_of(name, metric_kind::counter).series_by_labels[labels].value += delta;
}

void metrics_registry::set(const std::string& name, const label_set& labels,
                           double value) {
  std::lock_guard<std::mutex> guard{mtx_};
  family_of(name, metric_kind::gauge).series_by_labels[labels].value = value;
}

void metrics_registry::observe(const std::string& name, const label_set& labels,
                               double value) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& f = family_of(name, metric_kind::histogram);
  if (f.spec.kind != metric_kind::histogram)
    return;
  auto& s = f.series_by_labels[labels];
  if (s.counts.size() != f.spec.buckets.size())
    s.counts.assign(f.spec.buckets.size(), 0);
  auto b =
      std::lower_bound(f.spec.buckets.begin(), f.spec.buckets.end(), value);
  if (b != f.spec.buckets.end())
    ++s.counts[static_cast<size_t>(b - f.spec.buckets.begin())];
  ++s.count;
  s.sum += value;
}

double metrics_registry::value(const std::string& name,
                               const label_set& labels) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = index_.find(name);
  if (i == index_.end())
    return 0;
  auto& f = families_[i->second];
  auto s = f.series_by_labels.find(labels);
  if (s == f.series_by_labels.end())
    return 0;
  return f.spec.kind == metric_kind::histogram
             ? static_cast<double>(s->second.count)
             : s->second.value;
}

uint64_t metrics_registry::add_collector(collector fn) {
  std::lock_guard<std::mutex> guard{collectors_mtx_};
  auto id = next_collector_++;
  collectors_.emplace(id, std::move(fn));
  return id;
}

void metrics_registry::remove_collector(uint64_t id) {
  std::lock_guard<std::mutex> guard{collectors_mtx_};
  collectors_.erase(id);
}

void metrics_registry::collect() {
  // Collectors call add/set (which take mtx_), never this lock.
  std::lock_guard<std::mutex> guard{collectors_mtx_};
  for (auto& kv : collectors_)
    kv.second(*this);
}

std::string metrics_registry::render() {
  collect();
  std::ostringstream out;
  std::lock_guard<std::mutex> guard{mtx_};
  for (auto& f : families_) {
    auto& name = f.spec.name;
    out << "# HELP " << name << ' ' << escape_help(f.spec.help) << '\n'
        << "# TYPE " << name << ' ' << type_name(f.spec.kind) << '\n';
    // A family with no series yet shows its HELP and TYPE only: a
    // placeholder sample without the family's labels would be a series of
    // its own, and a wrong one.
    for (auto& [labels, s] : f.series_by_labels) {
      if (f.spec.kind != metric_kind::histogram) {
        out << name;
        write_labels(out, labels);
        out << ' ' << format_value(s.value) << '\n';
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t b = 0; b < f.spec.buckets.size(); ++b) {
        cumulative += b < s.counts.size() ? s.counts[b] : 0;
        out << name << "_bucket";
        write_labels(out, labels, format_value(f.spec.buckets[b]));
        out << ' ' << cumulative << '\n';
      }
      out << name << "_bucket";
      write_labels(out, labels, "+Inf");
      out << ' ' << s.count << '\n' << name << "_sum";
      write_labels(out, labels);
      out << ' ' << format_value(s.sum) << '\n' << name << "_count";
      write_labels(out, labels);
      out << ' ' << s.count << '\n';
    }
  }
  return out.str();
}

std::vector<series_sample> metrics_registry::samples() const {
  std::vector<series_sample> out;
  std::lock_guard<std::mutex> guard{mtx_};
  for (auto& f : families_)
    for (auto& [labels, s] : f.series_by_labels) {
      if (f.spec.kind == metric_kind::histogram) {
        out.push_back(
            {f.spec.name + "_count", labels, static_cast<double>(s.count)});
        out.push_back({f.spec.name + "_sum", labels, s.sum});
      } else {
        out.push_back({f.spec.name, labels, s.value});
      }
    }
  return out;
}

} // namespace dualpath::actors::observe
