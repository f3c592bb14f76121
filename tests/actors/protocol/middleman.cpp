// ctest-label: foundation
// ctest-links: CAF::io
// One message of every actor interface crosses between two actor systems over
// loopback (CAF middleman, TCP on 127.0.0.1): both systems register the
// vocabulary with add_message_types, as every dualpath process does.
#include <doctest/doctest.h>

#include <atomic>

#include <chrono>
#include <future>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/protocol/bulk_endpoint_actor.hpp"
#include "actors/protocol/decode_engine_actor.hpp"
#include "actors/protocol/node_supervisor_actor.hpp"
#include "actors/protocol/observer_actor.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "actors/protocol/register.hpp"
#include "actors/protocol/scheduler_actor.hpp"
#include "actors/protocol/storage_reader_actor.hpp"

using namespace dualpath::actors;
using dualpath::transport::remote_region;

namespace {

struct node_config : caf::actor_system_config {
  node_config() {
    dualpath::actors::add_message_types(*this);
    load<caf::io::middleman>();
    set("scheduler.policy", caf::atom("sharing"));
    set("scheduler.max-threads", 2);
  }
};

constexpr auto timeout = std::chrono::seconds(10);

struct fixture {
  node_config cfg_a;
  node_config cfg_b;
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};

  // Publishes `hdl` in system a on an ephemeral loopback port and returns the
  // proxy that system b obtains for it.
  template <class Handle>
  Handle cross(Handle hdl) {
    auto port = a.middleman().publish(hdl, 0, "127.0.0.1");
    REQUIRE_MESSAGE(port, (port ? "" : a.render(port.error())));
    auto proxy = b.middleman().remote_actor<Handle>("127.0.0.1", *port);
    REQUIRE_MESSAGE(proxy, (proxy ? "" : b.render(proxy.error())));
    return *proxy;
  }

  // Sends xs... from system b to `hdl` and returns the single reply value.
  template <class Reply, class Handle, class... Ts>
  Reply ask(const Handle& hdl, Ts... xs) {
    caf::scoped_actor self{b};
    Reply out{};
    bool ok = false;
    self->request(hdl, timeout, xs...)
        .receive(
            [&](Reply& x) {
              out = std::move(x);
              ok = true;
            },
            [&](caf::error& err) { FAIL(b.render(err)); });
    CHECK(ok);
    return out;
  }
};

remote_region region(const std::string& node) {
  return remote_region{node, 7, 0xfeed, 0x1000, 64, 4096};
}

} // namespace

TEST_CASE_FIXTURE(fixture, "scheduler interface over the middleman") {
  auto hdl = cross(a.spawn([]() -> scheduler_actor::behavior_type {
    return {
        [](submit_atom, const request_spec& r) {
          request_result res;
          res.id = r.id;
          res.blocks_verified = static_cast<uint32_t>(r.tokens.size());
          return res;
        },
        [](fetch_atom, const group_report&) { return work_batch{}; },
        [](report_atom, const group_report&) {},
        [](enroll_atom, const engine_registration&) { return true; },
        [](done_atom, const request_result&) {},
        [](fail_atom, const request_failure&) {},
    };
  }));
  auto res = ask<request_result>(
      hdl, submit_atom_v, request_spec{42, 1, 2, {10, 11, 12}, 5, {}, 0});
  CHECK_EQ(res.id, 42u);
  CHECK_EQ(res.blocks_verified, 3u);
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "prefill engine interface over the middleman") {
  auto got = std::make_shared<std::atomic<size_t>>(0);
  auto hdl = cross(a.spawn([got]() -> prefill_engine_actor::behavior_type {
    return {
        [got](prefill_atom, const work_batch& w) { *got += w.items.size(); },
        [](status_atom) {
          group_report g;
          g.group = 2;
          g.engines.push_back(engine_load{
              engine_id{"pe0", engine_role::prefill, 3}, 4, 5, 6, 7, 8});
          return g;
        },
    };
  }));
  work_batch w;
  w.items.resize(2);
  caf::anon_send(hdl, prefill_atom_v, w);
  auto load = ask<group_report>(hdl, status_atom_v);
  REQUIRE_EQ(load.engines.size(), 1u);
  CHECK_EQ(load.group, 2u);
  CHECK_EQ(load.engines[0].engine.node, "pe0");
  CHECK_EQ(load.engines[0].engine.rank, 3u);
  CHECK_EQ(load.engines[0].tok, 5u);
  CHECK_EQ(load.engines[0].free_hbm_bytes, 8u);
  CHECK_EQ(got->load(), 2u); // the batch crossed before the status reply
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "decode engine interface over the middleman") {
  auto hdl = cross(a.spawn([]() -> decode_engine_actor::behavior_type {
    return {
        [](assign_atom, const assignment&) {},
        [](admit_atom, const assignment& x) {
          return decode_slot{x.request.id, {region("de0")}, {7}};
        },
        [](push_atom, const layer_batch& b) {
          layer_batch r = b;
          for (auto& c : r.chunks)
            c.bytes = c.tokens * 2;
          return r;
        },
        [](layer_atom, const layer_batch&) {},
        [](prefilled_atom, const prefill_summary&) {},
        [](release_atom, uint64_t) {},
        [](status_atom) { return group_report{}; },
    };
  }));
  assignment x;
  x.request.id = 77;
  auto slot = ask<decode_slot>(hdl, admit_atom_v, x);
  CHECK_EQ(slot.request_id, 77u);
  REQUIRE_EQ(slot.blocks.size(), 1u);
  CHECK(slot.blocks[0] == region("de0"));
  CHECK(slot.failed == std::vector<block_hash>{7});
  layer_batch push{3, 0, {layer_chunk{77, 64, 10, 0, region("pe0")}}};
  auto moved = ask<layer_batch>(hdl, push_atom_v, push);
  REQUIRE_EQ(moved.chunks.size(), 1u);
  CHECK_EQ(moved.layer, 3u);
  CHECK_EQ(moved.chunks[0].bytes, 20u);
  CHECK(moved.chunks[0].destination == region("pe0"));
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "storage reader interface over the middleman") {
  auto hdl = cross(a.spawn([]() -> storage_reader_actor::behavior_type {
    return {
        [](read_atom, const read_request& r) {
          read_completion c;
          c.request_id = r.request_id;
          for (size_t i = 0; i < r.blocks.size(); ++i)
            c.leases.push_back(buffer_lease{
                i, r.blocks[i], uint32_t(r.first_block + i), region("snic0")});
          return c;
        },
        [](reserve_atom, const reserve_request& r) {
          read_completion c;
          c.request_id = r.request_id;
          for (auto k : r.block_indices)
            c.leases.push_back(buffer_lease{k, 0, k, region("snic0")});
          return c;
        },
        [](release_atom, uint64_t) {},
        [](release_atom, const lease_release&) {},
        [](persist_atom, const persist_request& p) { return p.hash; },
        [](persist_atom, const persist_batch& b) {
          return static_cast<uint32_t>(b.hashes.size() + b.parent);
        },
        [](queue_atom) { return read_queue_status{}; },
    };
  }));
  auto c = ask<read_completion>(hdl, read_atom_v,
                                read_request{9, {0xaa, 0xbb}, 4, 128});
  CHECK_EQ(c.request_id, 9u);
  REQUIRE_EQ(c.leases.size(), 2u);
  CHECK_EQ(c.leases[1].hash, 0xbbu);
  CHECK_EQ(c.leases[1].block_index, 5u);
  auto held =
      ask<read_completion>(hdl, reserve_atom_v, reserve_request{10, {3, 8}});
  REQUIRE_EQ(held.leases.size(), 2u);
  CHECK_EQ(held.leases[1].block_index, 8u);
  CHECK_EQ(ask<uint32_t>(hdl, persist_atom_v, persist_batch{{1, 2, 3}, 10, 64}),
           13u);
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "bulk endpoint interface over the middleman") {
  auto hdl = cross(a.spawn([]() -> bulk_endpoint_actor::behavior_type {
    return {
        [](connect_atom, const endpoint_info& peer) {
          return endpoint_info{"a", "tcp", "127.0.0.1:1", peer.details};
        },
        [](describe_atom) {
          return endpoint_info{"a", "tcp", "127.0.0.1:1", {}};
        },
        [](write_atom, const write_batch& w) {
          return batch_completion{w.tag, 0, 0, caf::error{}};
        },
    };
  }));
  auto info = ask<endpoint_info>(
      hdl, connect_atom_v, endpoint_info{"b", "tcp", "127.0.0.1:2", {1, 2, 3}});
  CHECK_EQ(info.node, "a");
  CHECK_EQ(info.details, std::vector<uint8_t>{1, 2, 3});
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "node supervisor interface carries actor handles") {
  auto hdl = cross(a.spawn([]() -> node_supervisor_actor::behavior_type {
    return {
        [](join_atom, node_info& n) {
          return cluster_view{1, {std::move(n)}, 0};
        },
        [](leave_atom, const std::string&) {},
        [](view_atom) { return cluster_view{}; },
    };
  }));
  // A node of system b joins with the handle of one of its actors; the handle
  // travels to system a and back and still reaches the actor.
  auto echo =
      b.spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  node_info n;
  n.name = "de1";
  n.actor_names = {"echo"};
  n.actors = {echo};
  auto view = ask<cluster_view>(hdl, join_atom_v, n);
  CHECK_EQ(view.epoch, 1u);
  REQUIRE_EQ(view.nodes.size(), 1u);
  REQUIRE_EQ(view.nodes[0].actors.size(), 1u);
  caf::scoped_actor self{b};
  self->request(view.nodes[0].actors[0], timeout, 41)
      .receive([](int y) { CHECK_EQ(y, 42); },
               [&](caf::error& err) { FAIL(b.render(err)); });
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "observer interface over the middleman") {
  auto seen = std::make_shared<std::promise<state_snapshot>>();
  auto fut = seen->get_future();
  auto obs = a.spawn([seen]() -> observer_actor::behavior_type {
    return {
        [seen](snapshot_atom, const state_snapshot& s) { seen->set_value(s); },
        [](event_atom, const event_record&) {},
    };
  });
  auto hdl = cross(obs);
  caf::anon_send(hdl, snapshot_atom_v,
                 state_snapshot{"reader0", 12, {metric_sample{"read_q", 3}}});
  REQUIRE(fut.wait_for(timeout) == std::future_status::ready);
  auto s = fut.get();
  CHECK_EQ(s.source, "reader0");
  REQUIRE_EQ(s.samples.size(), 1u);
  CHECK_EQ(s.samples[0].value, 3.0);
  caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown);
}
