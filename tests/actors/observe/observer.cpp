// ctest-label: observability
// ctest-links: actors_storage actors_placement
// The observer hub: an observer found through the actor registry receives
// periodic state snapshots per node (from the metrics registry) and every
// event; an actor's own snapshot becomes metrics; a terminated subscriber is
// dropped; messages and snapshots print every field with deep_to_string.
#include <doctest/doctest.h>

#include <thread>

#include <caf/all.hpp>

#include "actors/observe/metrics.hpp"
#include "actors/observe/observer.hpp"
#include "actors/placement/global_scheduler.hpp"
#include "actors/protocol/register.hpp"
#include "actors/storage/prefetching_reader.hpp"
#include "tests/actors/actor_config.hpp"
#include "tests/actors/observe/forwarder.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using namespace dualpath::actors::observe;

namespace {

constexpr auto timeout = std::chrono::seconds(10);

struct fixture {
  test::actor_config cfg{"sharing"};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<metrics_registry> metrics =
      std::make_shared<metrics_registry>();
  observer_hub_actor hub;

  fixture() {
    observer_hub_config hc;
    hc.metrics = metrics;
    hc.snapshot_period = std::chrono::milliseconds(20);
    hub = spawn_observer_hub(sys, hc);
  }

  ~fixture() {
    self->send_exit(hub, caf::exit_reason::user_shutdown);
  }

  // Waits for a snapshot from `source` (other snapshots are skipped).
  state_snapshot snapshot_from(const std::string& source) {
    state_snapshot out;
    bool found = false;
    for (int i = 0; i < 200 && !found; ++i)
      self->receive(
          [&](snapshot_atom, const state_snapshot& s) {
            if (s.source == source) {
              out = s;
              found = true;
            }
          },
          [](event_atom, const event_record&) {},
          caf::after(timeout) >> [&] { i = 200; });
    REQUIRE_MESSAGE(found, "no snapshot from " << source);
    return out;
  }
};

double sample(const state_snapshot& s, const std::string& name) {
  for (auto& x : s.samples)
    if (x.name == name)
      return x.value;
  FAIL("no sample " << name << " in " << caf::deep_to_string(s));
  return 0;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "an observer attached through the registry "
                           "receives periodic snapshots") {
  REQUIRE(find_observer_hub(sys));
  metrics->add("dualpath_snic_bytes_total", {{"node", "pe0"}}, 4096);
  metrics->set("dualpath_read_queue_tokens", {{"node", "pe0"}}, 640);
  metrics->add("dualpath_cnic_bytes_total",
               {{"node", "de0"}, {"nic", "cnic1"}, {"direction", "tx"}}, 7);
  metrics->add("dualpath_requests_completed_total", {}, 3);
  auto obs =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), true);
  REQUIRE(attach_observer(sys, caf::actor_cast<caf::actor>(obs)));
  auto pe0 = snapshot_from("pe0");
  CHECK(sample(pe0, "dualpath_snic_bytes_total") == 4096);
  CHECK(sample(pe0, "dualpath_read_queue_tokens") == 640);
  auto de0 = snapshot_from("de0");
  CHECK(sample(de0, "dualpath_cnic_bytes_total{nic=\"cnic1\",direction=\"tx\"}")
        == 7);
  auto all = snapshot_from("cluster");
  CHECK(sample(all, "dualpath_requests_completed_total") == 3);
  // Snapshots keep coming, with the registry's current values.
  metrics->add("dualpath_snic_bytes_total", {{"node", "pe0"}}, 4096);
  for (int i = 0; i < 50; ++i) {
    auto later = snapshot_from("pe0");
    if (sample(later, "dualpath_snic_bytes_total") == 8192)
      break;
    REQUIRE(i < 49);
  }
  self->send_exit(obs, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "events are forwarded and counted") {
  auto obs =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), true);
  self->send(hub, attach_atom_v, caf::actor_cast<caf::actor>(obs));
  // The attach and the event travel in order from this sender.
  self->send(hub, event_atom_v,
             event_record{"storage_reader", "error", 12, 34, "block missing"});
  self->send(hub, event_atom_v,
             event_record{"scheduler", "reroute", 13, 35, ""});
  std::vector<event_record> seen;
  while (seen.size() < 2)
    self->receive([&](event_atom, const event_record& e) { seen.push_back(e); },
                  [](snapshot_atom, const state_snapshot&) {},
                  caf::after(timeout) >> [&] { FAIL("no event"); });
  CHECK(seen[0].kind == "error");
  CHECK(seen[0].request_id == 12);
  CHECK(seen[1].kind == "reroute");
  CHECK(metrics->value("dualpath_errors_total", {{"source", "storage_reader"}})
        == 1);
  // Reroutes are the scheduler's to count (it does, through its hooks).
  CHECK(metrics->value("dualpath_reroutes_total") == 0);
  self->send_exit(obs, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "an actor's own snapshot becomes metrics") {
  auto obs =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), true);
  self->send(hub, attach_atom_v, caf::actor_cast<caf::actor>(obs));
  state_snapshot mine{"my_reader", 5, {{"my_prefetch_hits_total", 9}}};
  self->send(hub, snapshot_atom_v, mine);
  auto got = snapshot_from("my_reader");
  CHECK(sample(got, "my_prefetch_hits_total") == 9);
  CHECK(metrics->value("my_prefetch_hits_total", {{"source", "my_reader"}})
        == 9);
  CHECK(metrics->render().find("my_prefetch_hits_total{source=\"my_reader\"} 9")
        != std::string::npos);
  self->send_exit(obs, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "a terminated subscriber is dropped") {
  auto obs =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), true);
  self->send(hub, attach_atom_v, caf::actor_cast<caf::actor>(obs));
  self->send_exit(obs, caf::exit_reason::user_shutdown);
  self->wait_for(obs);
  // The hub keeps running and serving other observers.
  auto obs2 =
      sys.spawn(test::forwarder, caf::actor_cast<caf::actor>(self), true);
  REQUIRE(attach_observer(sys, caf::actor_cast<caf::actor>(obs2)));
  metrics->add("dualpath_snic_bytes_total", {{"node", "pe1"}}, 1);
  snapshot_from("pe1");
  self->send_exit(obs2, caf::exit_reason::user_shutdown);
}

TEST_CASE("snapshots and events print every field") {
  state_snapshot s{"pe0", 17, {{"dualpath_read_queue_tokens", 64}}};
  auto text = caf::deep_to_string(s);
  CHECK(text.find("state_snapshot") != std::string::npos);
  CHECK(text.find("pe0") != std::string::npos);
  CHECK(text.find("dualpath_read_queue_tokens") != std::string::npos);
  CHECK(text.find("64") != std::string::npos);
  event_record e{"scheduler", "reroute", 99, 5, "to pe1"};
  auto etext = caf::deep_to_string(e);
  CHECK(etext.find("event_record") != std::string::npos);
  CHECK(etext.find("to pe1") != std::string::npos);
}

TEST_CASE("reportable state prints every field") {
  span_record sp{"pe0", "cnic0 rx", "h2d", 7, 3, 100, 250, 4096};
  auto text = caf::deep_to_string(sp);
  CHECK(text.find("span_record") != std::string::npos);
  CHECK(text.find("cnic0 rx") != std::string::npos);
  CHECK(text.find("4096") != std::string::npos);
  scheduler_counters sc;
  sc.submitted = 11;
  sc.rerouted = 2;
  auto stext = caf::deep_to_string(sc);
  CHECK(stext.find("scheduler_counters") != std::string::npos);
  CHECK(stext.find("11") != std::string::npos);
  prefetch_stats ps{4, 3, 2, 1, 5};
  CHECK(caf::deep_to_string(ps) == "prefetch_stats(4, 3, 2, 1, 5)");
}

TEST_CASE("snapshot and event series carry the mode the process runs") {
  test::actor_config cfg{"sharing"};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto metrics = std::make_shared<metrics_registry>();
  auto mode = std::make_shared<std::string>("basic");
  observer_hub_config hc;
  hc.metrics = metrics;
  hc.snapshot_period = std::chrono::milliseconds(0);
  hc.mode = [mode] { return *mode; };
  auto hub = spawn_observer_hub(sys, hc);
  self->send(
      hub, snapshot_atom_v,
      state_snapshot{"prefetch.de0", 1, {{"dualpath_prefetch_hits_total", 4}}});
  self->send(hub, event_atom_v, event_record{"ext", "error", 1, 2, "x"});
  for (int i = 0; i < 200
                  && metrics->value("dualpath_errors_total",
                                    {{"mode", "basic"}, {"source", "ext"}})
                         == 0;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(metrics->value("dualpath_prefetch_hits_total",
                       {{"mode", "basic"}, {"source", "prefetch.de0"}})
        == 4);
  CHECK(metrics->value("dualpath_errors_total",
                       {{"mode", "basic"}, {"source", "ext"}})
        == 1);
  auto text = metrics->render();
  CHECK(text.find("# TYPE dualpath_prefetch_hits_total counter")
        != std::string::npos);
  self->send_exit(hub, caf::exit_reason::user_shutdown);
}
