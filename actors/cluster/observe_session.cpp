#include "actors/cluster/observe_session.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include "actors/observe/http_server.hpp"
#include "actors/observe/metrics.hpp"
#include "actors/observe/timeline.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::actors::cluster {

using namespace observe;

namespace {

// The hooks of one cluster: metrics into the registry, spans into the
// timeline (section set per cluster), events to the hub.
class recorder : public cluster_hooks {
public:
  recorder(std::shared_ptr<observe::metrics_registry> metrics,
           std::shared_ptr<timeline> spans, observer_hub_actor hub,
           std::string mode)
      : metrics_(std::move(metrics)),
        spans_(std::move(spans)),
        hub_(std::move(hub)),
        mode_(std::move(mode)) {
    // nop
  }

  void bind(const emulated_time& time) override {
    time_ = time;
  }

  int64_t at(time_point actor_now) const override {
    return time_.since_start_ns(actor_now);
  }

  bool tracing() const override {
    return spans_ != nullptr;
  }

  void span(span_record x) override {
    if (spans_)
      spans_->add(std::move(x));
  }

  void describe(const std::string& name, metric_kind kind,
                const std::string& help) override {
    metrics_->declare(family_spec{name, kind, help, {}});
  }

  void count(const std::string& name, const label_set& labels,
             double delta) override {
    metrics_->add(name, with_mode(labels), delta);
  }

  void gauge(const std::string& name, const label_set& labels,
             double value) override {
    metrics_->set(name, with_mode(labels), value);
  }

  void observe(const std::string& name, const label_set& labels,
               double value) override {
    metrics_->observe(name, with_mode(labels), value);
  }

  void event(const std::string& source, const std::string& kind,
             uint64_t request_id, int64_t at_ns,
             const std::string& detail) override {
    if (!hub_)
      return;
    event_record ev;
    ev.source = source;
    ev.kind = kind;
    ev.request_id = request_id;
    ev.at_ns = at_ns;
    ev.detail = detail;
    caf::anon_send(hub_, event_atom_v, std::move(ev));
  }

private:
  // Every series of a cluster names its mode: one process runs several.
  label_set with_mode(const label_set& labels) const {
    label_set out;
    out.reserve(labels.size() + 1);
    out.emplace_back("mode", mode_);
    out.insert(out.end(), labels.begin(), labels.end());
    return out;
  }

  std::shared_ptr<observe::metrics_registry> metrics_;
  std::shared_ptr<timeline> spans_;
  emulated_time time_;
  observe::observer_hub_actor hub_;
  std::string mode_;
};

// Removes its collector after a last collection.
struct watch_handle {
  std::shared_ptr<observe::metrics_registry> metrics;
  uint64_t id = 0;
  ~watch_handle() {
    metrics->collect();
    metrics->remove_collector(id);
  }
};

} // namespace

observe_options observe_options_from(const config::settings& cfg) {
  observe_options o;
  o.metrics_address = cfg.string("observe.metrics_address");
  o.metrics_port = static_cast<uint16_t>(cfg.integer("observe.metrics_port"));
  o.trace_file = cfg.string("observe.trace_file");
  o.snapshot_period =
      std::chrono::milliseconds(cfg.integer("observe.snapshot_period_ms"));
  return o;
}

observe_session::observe_session(observe_options opts)
    : opts_(std::move(opts)), mode_(std::make_shared<mode_cell>()) {
  metrics_ = std::make_shared<metrics_registry>();
  if (!opts_.trace_file.empty())
    timeline_ = std::make_shared<timeline>();
}

caf::expected<std::unique_ptr<observe_session>>
observe_session::make(caf::actor_system& sys, observe_options opts) {
  std::unique_ptr<observe_session> s{new observe_session(std::move(opts))};
  if (s->opts_.metrics_port != 0) {
    std::map<std::string, http_server::route> routes;
    routes["/metrics"] = [m = s->metrics_] {
      return http_response{200, "text/plain; version=0.0.4; charset=utf-8",
                           m->render()};
    };
    routes["/"] = [] {
      return http_response{200, "text/plain; charset=utf-8",
                           "dualpath: metrics at /metrics\n"};
    };
    auto srv = http_server::make(s->opts_.metrics_address,
                                 s->opts_.metrics_port, std::move(routes));
    if (!srv)
      return std::move(srv.error());
    s->server_ = std::move(*srv);
  }
  observer_hub_config hc;
  hc.metrics = s->metrics_;
  hc.snapshot_period = s->opts_.snapshot_period;
  hc.mode = [cell = s->mode_] {
    std::lock_guard<std::mutex> guard{cell->mtx};
    return cell->mode;
  };
  s->hub_ = spawn_observer_hub(sys, std::move(hc));
  return s;
}

observe_session::~observe_session() {
  server_.reset();
  if (hub_)
    caf::anon_send_exit(hub_, caf::exit_reason::user_shutdown);
}

std::shared_ptr<cluster_hooks>
observe_session::hooks_for(const std::string& section) {
  if (timeline_)
    timeline_->set_section(section);
  {
    std::lock_guard<std::mutex> guard{mode_->mtx};
    mode_->mode = section;
  }
  return std::make_shared<recorder>(metrics_, timeline_, hub_, section);
}

std::shared_ptr<void> observe_session::watch(const std::vector<node_ptr>& nodes,
                                             uint32_t byte_scale,
                                             const std::string& mode) {
  // Counters add what moved since the last collection; each mode's cluster
  // has series of its own (label mode).
  struct last_seen {
    std::vector<uint64_t> values;
  };
  auto seen = std::make_shared<last_seen>();
  auto fn = [nodes, seen, byte_scale, mode](metrics_registry& m) {
    size_t k = 0;
    auto delta = [&](uint64_t now) {
      if (seen->values.size() <= k)
        seen->values.resize(k + 1, 0);
      auto d = now >= seen->values[k] ? now - seen->values[k] : 0;
      seen->values[k++] = now;
      return static_cast<double>(d);
    };
    for (auto& n : nodes) {
      if (n->snic)
        m.add("dualpath_snic_bytes_total", {{"mode", mode}, {"node", n->name}},
              delta(n->snic->bytes()));
      if (n->dram)
        m.add("dualpath_dram_bytes_total", {{"mode", mode}, {"node", n->name}},
              delta(n->dram->bytes()));
      for (size_t g = 0; g < n->cnic_rx.size(); ++g)
        m.add("dualpath_cnic_bytes_total",
              {{"mode", mode},
               {"node", n->name},
               {"nic", "cnic" + std::to_string(g)},
               {"direction", "rx"}},
              delta(n->cnic_rx[g]->bytes()));
      for (size_t g = 0; g < n->cnic_tx.size(); ++g)
        m.add("dualpath_cnic_bytes_total",
              {{"mode", mode},
               {"node", n->name},
               {"nic", "cnic" + std::to_string(g)},
               {"direction", "tx"}},
              delta(n->cnic_tx[g]->bytes()));
      if (n->bulk) {
        auto st = n->bulk->stats();
        for (size_t c = 0; c < transport::traffic_class_count; ++c)
          m.add("dualpath_bulk_bytes_total",
                {{"mode", mode},
                 {"node", n->name},
                 {"class", transport::to_string(
                               static_cast<transport::traffic_class>(c))}},
                delta(st.bytes_sent[c] * byte_scale));
        m.add("dualpath_bulk_tcp_fallback_total",
              {{"mode", mode}, {"node", n->name}}, delta(st.tcp_fallbacks));
      }
    }
  };
  auto h = std::make_shared<watch_handle>();
  h->metrics = metrics_;
  h->id = metrics_->add_collector(std::move(fn));
  return h;
}

bool observe_session::observed() const {
  return server_ != nullptr || timeline_ != nullptr
         || opts_.snapshot_period.count() > 0;
}

uint16_t observe_session::metrics_port() const {
  return server_ ? server_->port() : 0;
}

size_t observe_session::spans() const {
  return timeline_ ? timeline_->size() : 0;
}

caf::error observe_session::finish() {
  if (!timeline_)
    return caf::none;
  return timeline_->write(opts_.trace_file);
}

} // namespace dualpath::actors::cluster
