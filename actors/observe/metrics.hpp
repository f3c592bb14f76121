// A metrics registry in the Prometheus data model: families of counters,
// gauges and histograms, each series identified by its labels, rendered in
// the Prometheus text exposition format (version 0.0.4) for the /metrics
// endpoint and sampled into state snapshots for the observer hub.
//
// dualpath's standard families (names and units follow Prometheus
// conventions: `_total` counters, `_bytes`, `_seconds`, `_tokens`) are
// declared by the constructor; see metrics.cpp for the list and their help.
// Other families are declared with declare(), or implicitly by their first
// use. Collectors (functions run before each render or sample) turn state
// that lives elsewhere (link byte counters, reader counters) into series.
//
// Thread safety: every member function may be called from any thread.
// Collectors run without the registry's lock held (they call add/set).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/observe/hooks.hpp"

namespace dualpath::actors::observe {

/// One family: name, kind, help and (histograms) bucket upper bounds.
struct family_spec {
  std::string name;
  metric_kind kind = metric_kind::counter;
  std::string help;
  std::vector<double> buckets; ///< Histograms only; ascending.
};

/// The default buckets of `_seconds` histograms (1 ms .. 60 s).
std::vector<double> seconds_buckets();

/// One series' current value (histograms: count and sum as two samples).
struct series_sample {
  std::string name; ///< Family name (histograms: name_count, name_sum).
  label_set labels;
  double value = 0;
};

class metrics_registry {
public:
  using collector = std::function<void(metrics_registry&)>;

  /// Declares the standard dualpath families.
  metrics_registry();

  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  /// Declares (or redeclares, keeping its series) a family.
  void declare(family_spec spec);

  /// Adds `delta` (>= 0) to a counter series.
  void add(const std::string& name, const label_set& labels, double delta = 1);

  /// Sets a gauge series (or a counter series to an absolute value).
  void set(const std::string& name, const label_set& labels, double value);

  /// Adds one observation to a histogram series.
  void observe(const std::string& name, const label_set& labels, double value);

  /// The current value of a counter or gauge series (histograms: the
  /// count); 0 when absent.
  double value(const std::string& name, const label_set& labels = {}) const;

  /// Registers a collector; returns its id for remove_collector.
  uint64_t add_collector(collector fn);
  void remove_collector(uint64_t id);

  /// Runs every collector.
  void collect();

  /// Runs the collectors and renders every family in the text format.
  std::string render();

  /// Every series' current value (collectors not run).
  std::vector<series_sample> samples() const;

private:
  struct series {
    double value = 0;             // counters, gauges
    std::vector<uint64_t> counts; // histograms: per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
  };

  struct family {
    family_spec spec;
    std::map<label_set, series> series_by_labels;
  };

  family& family_of(const std::string& name, metric_kind kind);

  mutable std::mutex mtx_;
  std::vector<family> families_; // declaration order
  std::map<std::string, size_t> index_;
  std::mutex collectors_mtx_;
  std::map<uint64_t, collector> collectors_;
  uint64_t next_collector_ = 1;
};

/// Escapes a label value for the text format (backslash, quote, newline).
std::string escape_label_value(const std::string& x);

/// Formats a sample value as the text format expects (integers without a
/// fraction, +Inf/-Inf/NaN spelled out).
std::string format_value(double x);

} // namespace dualpath::actors::observe
