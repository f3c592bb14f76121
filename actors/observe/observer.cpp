#include "actors/observe/observer.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/observe/metrics.hpp"

// Private atoms: messages this file's actors send themselves (timers,
// completions from other threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::observe::hub_atoms, tick_atom,
             "obstick")

namespace dualpath::actors::observe {

namespace {

using namespace dualpath::actors::observe::hub_atoms;

using hub_impl = observer_hub_actor::extend<caf::reacts_to<tick_atom>>;

struct hub_state {
  observer_hub_config cfg;
  std::vector<observer_actor> subscribers;
  static inline const char* name = "dualpath.observer";
};

using self_ptr = hub_impl::stateful_pointer<hub_state>;

// `name{k="v",...}` for the labels other than `skip`.
// The labels of a series made from a snapshot or an event: the current
// mode (if any) and the source (if any).
label_set labels_of(const observer_hub_config& cfg, const std::string& source) {
  label_set out;
  if (cfg.mode)
    if (auto mode = cfg.mode(); !mode.empty())
      out.emplace_back("mode", std::move(mode));
  if (!source.empty())
    out.emplace_back("source", source);
  return out;
}

std::string sample_name(const series_sample& s, const std::string& skip) {
  std::string out = s.name;
  bool first = true;
  for (auto& [k, v] : s.labels) {
    if (k == skip)
      continue;
    out += first ? "{" : ",";
    out += k + "=\"" + escape_label_value(v) + "\"";
    first = false;
  }
  if (!first)
    out += "}";
  return out;
}

template <class... Ts>
void broadcast(self_ptr self, const Ts&... xs) {
  for (auto& s : self->state.subscribers)
    self->send(s, xs...);
}

void tick(self_ptr self) {
  auto& st = self->state;
  if (!st.cfg.metrics || st.subscribers.empty())
    return;
  st.cfg.metrics->collect();
  std::map<std::string, state_snapshot> by_source;
  auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 self->clock().now().time_since_epoch())
                 .count();
  for (auto& s : st.cfg.metrics->samples()) {
    std::string source = "cluster";
    for (auto& [k, v] : s.labels)
      if (k == "node")
        source = v;
    auto& snap = by_source[source];
    snap.source = source;
    snap.at_ns = now;
    snap.samples.push_back(metric_sample{sample_name(s, "node"), s.value});
  }
  for (auto& kv : by_source)
    broadcast(self, snapshot_atom_v, kv.second);
}

} // namespace

observer_hub_actor spawn_observer_hub(caf::actor_system& sys,
                                      observer_hub_config cfg) {
  auto hdl = sys.spawn([cfg = std::move(cfg)](
                           self_ptr self) mutable -> hub_impl::behavior_type {
    self->state.cfg = std::move(cfg);
    self->set_down_handler([self](const caf::down_msg& dm) {
      auto& subs = self->state.subscribers;
      subs.erase(std::remove_if(subs.begin(), subs.end(),
                                [&](const observer_actor& a) {
                                  return a.address() == dm.source;
                                }),
                 subs.end());
    });
    self->attach_functor(
        [sys = &self->system(), addr = self->address()](const caf::error&) {
          // Leave the registry only if it still names this hub.
          auto cur = sys->registry().get<caf::actor>(observer_name);
          if (cur && cur.address() == addr)
            sys->registry().erase(observer_name);
        });
    auto period = self->state.cfg.snapshot_period;
    if (period.count() > 0)
      self->delayed_send(self, period, tick_atom_v);
    return {
        [self](attach_atom, const caf::actor& subscriber) {
          if (!subscriber)
            return;
          auto& subs = self->state.subscribers;
          auto typed = caf::actor_cast<observer_actor>(subscriber);
          if (std::find(subs.begin(), subs.end(), typed) != subs.end())
            return;
          self->monitor(subscriber);
          subs.push_back(std::move(typed));
        },
        [self](snapshot_atom, const state_snapshot& snap) {
          if (auto& m = self->state.cfg.metrics)
            for (auto& s : snap.samples)
              m->set(s.name, labels_of(self->state.cfg, snap.source), s.value);
          broadcast(self, snapshot_atom_v, snap);
        },
        [self](event_atom, const event_record& ev) {
          if (auto& m = self->state.cfg.metrics) {
            if (ev.kind == "error")
              m->add("dualpath_errors_total",
                     labels_of(self->state.cfg, ev.source));
            else if (ev.kind == "tcp_fallback")
              m->add("dualpath_bulk_tcp_fallback_total",
                     labels_of(self->state.cfg, {}));
          }
          broadcast(self, event_atom_v, ev);
        },
        [self](tick_atom) {
          tick(self);
          self->delayed_send(self, self->state.cfg.snapshot_period,
                             tick_atom_v);
        },
    };
  });
  auto hub = caf::actor_cast<observer_hub_actor>(hdl);
  sys.registry().put(observer_name, hub);
  return hub;
}

observer_hub_actor find_observer_hub(caf::actor_system& sys) {
  return sys.registry().get<observer_hub_actor>(observer_name);
}

bool attach_observer(caf::actor_system& sys, const caf::actor& subscriber) {
  auto hub = find_observer_hub(sys);
  if (!hub || !subscriber)
    return false;
  caf::anon_send(hub, attach_atom_v, subscriber);
  return true;
}

} // namespace dualpath::actors::observe
