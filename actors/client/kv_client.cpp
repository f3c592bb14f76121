#include "actors/client/kv_client.hpp"

#include <algorithm>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/cluster/cluster.hpp"
#include "actors/node/cluster_file.hpp"
#include "actors/node/node_runtime.hpp"
#include "actors/node/node_system.hpp"
#include "actors/protocol/bulk_endpoint_actor.hpp"
#include "actors/protocol/node_supervisor_actor.hpp"
#include "actors/protocol/register.hpp"
#include "config/enum_names.hpp"
#include "config/settings.hpp"
#include "gpu/device_pages.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/errors.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::actors::client {

namespace bulk = transport::bulk;
namespace storage = transport::storage;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long after an operation's deadline a remote decode node's answer is
// still waited for (the remote sender fails a batch past its deadline and
// replies; this covers the message's way back) before the operation ends
// without it. Not a setting: it only bounds a failure's report.
constexpr milliseconds remote_grace{1000};
// How often the client polls the deployment's view for the decode node.
constexpr milliseconds view_period{200};
// A remote read whose reply is later than its deadline still hands its
// leases back as long as it comes within this (the requester lives that
// long, or until the client is destroyed).
constexpr milliseconds late_reply_window{60'000};

constexpr std::string_view load_path_names[] = {"automatic", "pe", "de",
                                                "split"};

std::string to_string(load_path x) {
  return config::name_of(x, load_path_names, "load_path");
}

std::string to_string(memory_kind x) {
  switch (x) {
    case memory_kind::host:
      return "host";
    case memory_kind::cuda:
      return "cuda";
  }
  return "memory_kind(" + std::to_string(static_cast<int>(x)) + ")";
}

namespace {

caf::error bad_input(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, std::move(what));
}

// Hands `leases` back to the reader that granted them.
void release_leases(const storage_reader_actor& reader,
                    std::vector<uint64_t> leases) {
  if (!leases.empty() && reader)
    caf::anon_send(reader, release_atom_v, lease_release{std::move(leases)});
}

// The lease ids of a reader's answer.
std::vector<uint64_t> lease_ids(const read_completion& c) {
  std::vector<uint64_t> out;
  for (auto& l : c.leases)
    out.push_back(l.lease_id);
  return out;
}

// Where an operation is: running (something may still write into its pages)
// or ended (reported by finished() once).
enum class op_phase : uint8_t { running, ended };

// A layer of a load into device pages: its staged bytes not yet copied
// into the device pages, being copied (by one waiter; others wait for it),
// or copied.
enum class landing : uint8_t { pending, copying, done };

// One load or save. Guarded by impl::mtx.
struct op_state {
  finished_op info;
  op_phase phase = op_phase::running;
  clock_type::time_point deadline;
  // Loads: per layer, the bulk batches not yet complete; reads not yet
  // answered (a layer is ready once no read and no batch of it is left).
  std::vector<uint32_t> layer_batches;
  uint32_t reads_pending = 0;
  // Everything still outstanding (reads, batches, persists); the operation
  // ends when it reaches 0.
  uint32_t outstanding = 0;
  std::vector<block_error> errors;
  // Reads and batches on a remote decode node not yet answered (part of
  // outstanding; remote_reads also of reads_pending). Cut (no longer
  // waited for) when the node is lost or they are late past the grace.
  uint32_t remote_pending = 0;
  uint32_t remote_reads = 0;
  bool remote_cut = false;
  // Leases to hand back when the operation ends, per reader, with the
  // reader that granted them (a deployment's decode node may restart under
  // a new handle meanwhile: its leases go to the one that granted them).
  std::vector<uint64_t> pe_leases;
  std::vector<uint64_t> de_leases;
  storage_reader_actor pe_reader;
  storage_reader_actor de_reader;
  // Loads into device pages: the pages, and per layer whether its staged
  // bytes were copied into the device pages.
  std::vector<uint32_t> pages;
  std::vector<landing> landed;
};

using op_ptr = std::shared_ptr<op_state>;

} // namespace

// Where a deployment's decode node is (deployments only: an embedded
// client's decode node is in this process, see impl::deployed).
enum class remote_phase : uint8_t {
  joining, ///< Not yet reached (make() waits for it).
  up,      ///< Its reader and bulk endpoint answer; the bulk link is set up.
  lost,    ///< Left the deployment's view (killed, stopped, unreachable).
};

// Which reader a part of a load goes to.
enum class side_t : uint8_t { pe, de };

struct kv_client::impl {
  explicit impl(bool in_deployment) : deployed(in_deployment) {
    // nop
  }

  // Whether the client joined a deployment (its decode node is a remote
  // process) or embeds both nodes; fixed at construction, read without mtx.
  const bool deployed;
  client_config cfg;
  // Deployments: the settings and cluster file (outlive the actor system).
  config::settings dep_settings;
  std::optional<node::cluster_file> cluster;
  std::unique_ptr<caf::actor_system_config> sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<storage::block_store> store;
  cluster::cluster_spec spec;
  emulated_time time;
  node_ptr pe;
  node_ptr de;                                   // embedded only
  std::vector<std::shared_ptr<void>> keep_alive; // pools, registrations
  // Deployments: the decode node (guarded by mtx) and the actor that polls
  // the view; every requester to the decode node is linked to it, so that
  // killing it at destruction ends them all.
  remote_phase remote = remote_phase::joining;
  std::string remote_name;
  storage_reader_actor remote_reader;
  bulk_endpoint_actor remote_bulk;
  std::vector<uint8_t> remote_details;
  caf::error remote_why;   // why it is not up
  bool connecting = false; // a set-up of the decode node is under way
  caf::actor hub;

  mutable std::mutex mtx;
  std::condition_variable cv;
  // The engine's layers, registered with the engine node's (pe) transport.
  std::vector<bulk::local_registration> layers;
  // Per layer, its device pages (null for host memory), and whether the
  // registration above is of the device memory itself (the NIC writes and
  // reads it: verbs with dma-buf or nvidia-peermem) or of the pages'
  // pinned staging area.
  std::vector<std::unique_ptr<gpu::device_pages>> device_layers;
  std::vector<bool> direct;
  std::string memory_path;
  uint32_t pages = 0;
  uint64_t next_ticket = 1;
  std::map<uint64_t, op_ptr> ops;
  std::unordered_map<uint64_t, std::optional<caf::expected<prefix_hit>>>
      lookups;

  ~impl() {
    // Running operations end by their deadlines; then the actors stop
    // before the nodes' pools and registrations go.
    {
      std::unique_lock<std::mutex> guard{mtx};
      for (;;) {
        for (auto& kv : ops)
          maybe_end(kv.second);
        if (std::all_of(ops.begin(), ops.end(), [](const auto& kv) {
              return kv.second->phase == op_phase::ended;
            }))
          break;
        cv.wait_for(guard, std::chrono::milliseconds{10});
      }
    }
    if (hub)
      caf::anon_send_exit(hub, caf::exit_reason::kill);
    for (auto* n : {&pe, &de})
      if (*n && (*n)->reader)
        caf::anon_send_exit((*n)->reader, caf::exit_reason::user_shutdown);
    if (sys)
      sys->await_all_actors_done();
    // Registrations before the backends that own them (in the nodes), and
    // before the staging areas they register.
    layers.clear();
    device_layers.clear();
    keep_alive.clear();
    pe.reset();
    de.reset();
    // Every actor handle (the hub, the decode node's proxies) before the
    // actor system that owns them.
    hub = nullptr;
    remote_reader = nullptr;
    remote_bulk = nullptr;
    sys.reset();
    sys_cfg.reset();
  }

  const storage_reader_actor& reader_of(side_t s) const {
    if (s == side_t::pe)
      return pe->reader;
    return deployed ? remote_reader : de->reader;
  }

  bool remote_side(side_t s) const {
    return s == side_t::de && deployed;
  }

  // The decode node is lost: every operation stops waiting for it (the
  // node can write nothing more once it is gone). Called with mtx held.
  void cut_remote(const op_ptr& op, caf::error why) {
    if (op->remote_pending == 0 || op->phase == op_phase::ended)
      return;
    fail(op, std::move(why));
    op->outstanding -= op->remote_pending;
    op->reads_pending -= op->remote_reads;
    op->remote_pending = 0;
    op->remote_reads = 0;
    op->remote_cut = true;
    maybe_end(op);
  }

  // The client gives up on the decode node (it left the view, restarted,
  // disconnected, or did not answer past a deadline): its bulk peer is
  // dropped, so that no more of its writes land in the pages (verbs: the
  // queue pair goes), and every operation stops waiting for it. It is set
  // up again when the view shows it. Called with mtx held.
  void lose_remote(caf::error why) {
    pe->bulk->drop_peer(remote_name);
    remote = remote_phase::lost;
    remote_why = why;
    for (auto& kv : ops)
      cut_remote(kv.second, why);
    cv.notify_all();
  }

  clock_type::time_point deadline_of(std::chrono::milliseconds d) const {
    return clock_type::now()
           + (d.count() > 0 ? d
                            : std::chrono::milliseconds{cfg.default_deadline});
  }

  caf::error check_pages(const std::vector<uint32_t>& pages_of) const {
    if (layers.empty())
      return bad_input("no KV memory registered (register_kv first)");
    std::unordered_set<uint32_t> seen;
    for (auto p : pages_of) {
      if (p >= pages)
        return bad_input("page " + std::to_string(p)
                         + " is past the registered memory of "
                         + std::to_string(pages) + " pages");
      if (!seen.insert(p).second)
        return bad_input("page " + std::to_string(p) + " named twice");
    }
    return caf::none;
  }

  // Checks what loads and saves share (pages, buffer room) and enters a new
  // operation. Called with mtx held.
  caf::expected<op_ptr> admit(finished_op::kind_t kind, uint64_t request_id,
                              const std::vector<uint32_t>& pages_of,
                              std::chrono::milliseconds deadline) {
    if (auto err = check_pages(pages_of))
      return err;
    if (pages_of.size() > cfg.buffer_blocks)
      return bad_input(std::to_string(pages_of.size())
                       + " blocks exceed a node's buffer of "
                       + std::to_string(cfg.buffer_blocks));
    auto op = std::make_shared<op_state>();
    op->info.kind = kind;
    op->info.ticket = next_ticket++;
    op->info.request_id = request_id;
    op->deadline = deadline_of(deadline);
    ops.emplace(op->info.ticket, op);
    return op;
  }

  // Ends `op` if nothing of it is outstanding but reads past the deadline
  // (those are abandoned: their late replies only hand their leases back):
  // hands its leases back and wakes waiters. Called with mtx held.
  void maybe_end(const op_ptr& op) {
    if (op->phase == op_phase::ended)
      return;
    if (op->remote_pending > 0
        && clock_type::now() >= op->deadline + remote_grace) {
      // Given up on: its writes must not land after the load is reported.
      if (remote == remote_phase::up)
        return lose_remote(caf::make_error(
            caf::sec::request_timeout,
            "decode node " + remote_name + " did not answer by the deadline"));
      return cut_remote(
          op, caf::make_error(caf::sec::request_timeout,
                              "decode node " + remote_name
                                  + " did not answer by the deadline"));
    }
    if (op->outstanding > op->reads_pending)
      return; // a batch or a persist may still write
    if (op->reads_pending > 0) {
      if (clock_type::now() < op->deadline)
        return;
      fail(op,
           caf::make_error(caf::sec::request_timeout,
                           op->info.kind == finished_op::kind_t::save
                               ? "staging slots not reserved by the deadline"
                               : "storage read not answered by the deadline"));
    }
    op->phase = op_phase::ended;
    release_leases(op->pe_reader, std::move(op->pe_leases));
    release_leases(op->de_reader, std::move(op->de_leases));
    cv.notify_all();
  }

  void fail(const op_ptr& op, caf::error err) {
    if (!op->info.error)
      op->info.error = std::move(err);
  }

  bool has_device_layers() const {
    return std::any_of(device_layers.begin(), device_layers.end(),
                       [](const auto& p) { return p != nullptr; });
  }

  // The copy chunks of `pages_of` in one layer (the same offset in the
  // staging area and the device pages).
  std::vector<gpu::copy_chunk>
  page_chunks(const std::vector<uint32_t>& pages_of) const {
    auto page = cfg.geometry.layer_bytes();
    std::vector<gpu::copy_chunk> out;
    for (auto p : pages_of) {
      auto off = static_cast<size_t>(uint64_t{p} * page);
      out.push_back(gpu::copy_chunk{off, off, static_cast<size_t>(page)});
    }
    return out;
  }

  // Copies layer `layer` of load `op` from the staging area into its device
  // pages once (the first caller copies, later ones wait for it), unless
  // the layer is host memory or the load failed. Called with `guard` (mtx)
  // held; releases it while copying. A failed copy fails the load.
  void land(const op_ptr& op, uint32_t layer,
            std::unique_lock<std::mutex>& guard) {
    if (layer >= device_layers.size() || !device_layers[layer]
        || op->landed.size() <= layer)
      return;
    cv.wait(guard, [&] { return op->landed[layer] != landing::copying; });
    if (op->landed[layer] == landing::done || op->info.error)
      return;
    op->landed[layer] = landing::copying;
    auto* dev = device_layers[layer].get();
    bool in_place = direct[layer];
    auto chunks = page_chunks(op->pages);
    guard.unlock();
    // In place: the NIC wrote the device memory; its writes are made
    // visible. Staged: the staging area is copied in.
    auto err = in_place ? dev->order_remote_writes() : dev->to_device(chunks);
    guard.lock();
    op->landed[layer] = landing::done;
    if (err)
      fail(op, caf::make_error(caf::sec::runtime_error,
                               "layer " + std::to_string(layer)
                                   + (in_place ? ": ordering the NIC's writes "
                                                 "into "
                                               : ": copying the staged pages "
                                                 "into ")
                                   + dev->describe()
                                   + " failed: " + gpu::describe(err)));
    cv.notify_all();
  }

  // Whether every layer of a load into device pages is in them (or the load
  // failed); true for everything else.
  static bool landed(const op_state& op) {
    return op.info.error
           || std::all_of(op.landed.begin(), op.landed.end(),
                          [](landing x) { return x == landing::done; });
  }

  // Every layer of an ended load into device pages (see land).
  void land_all(const op_ptr& op, std::unique_lock<std::mutex>& guard) {
    if (op->info.kind != finished_op::kind_t::load || op->landed.empty())
      return;
    for (uint32_t l = 0; l < op->landed.size(); ++l)
      land(op, l, guard);
  }

  // A read of one side answered: posts its blocks layer by layer (layer l of
  // every block as one batch) from the side's buffer into the pages: on the
  // side's own bulk transport in this process, or, for a deployment's decode
  // node, by its bulk endpoint over the deployment's transport. `self` is
  // the actor the reply came to.
  void on_read(const op_ptr& op, side_t side, uint32_t first,
               const std::vector<block_hash>& blocks,
               const std::vector<uint32_t>& pages_of,
               caf::expected<read_completion> res,
               caf::event_based_actor* self) {
    std::vector<std::pair<uint32_t, buffer_lease>> landed;
    bulk_endpoint_actor writer; // the decode node's, for a remote part
    bool remote_part;
    {
      std::lock_guard<std::mutex> guard{mtx};
      remote_part = remote_side(side);
      writer = remote_bulk;
      if (op->phase == op_phase::ended || (remote_part && op->remote_cut)) {
        // Abandoned (at its deadline, or its node was lost): nothing more
        // lands in the pages; the leases go back to the reader that
        // answered.
        if (res)
          release_leases(side == side_t::pe ? op->pe_reader : op->de_reader,
                         lease_ids(*res));
        return;
      }
      --op->reads_pending;
      --op->outstanding;
      if (remote_part) {
        --op->remote_pending;
        --op->remote_reads;
      }
      if (!res) {
        fail(op, std::move(res.error()));
        maybe_end(op);
        cv.notify_all();
        return;
      }
      auto& leases = side == side_t::pe ? op->pe_leases : op->de_leases;
      for (auto& l : res->leases)
        leases.push_back(l.lease_id);
      for (size_t f = 0; f < res->failed.size(); ++f) {
        auto h = res->failed[f];
        auto i = std::find(blocks.begin() + first, blocks.end(), h);
        auto index = static_cast<uint32_t>(i - blocks.begin());
        // The reader's reason (the store's check that failed), else a
        // generic one.
        auto why = f < res->why_failed.size() && res->why_failed[f]
                       ? res->why_failed[f]
                       : caf::make_error(storage::storage_errc::io_error,
                                         "no reason given by the reader");
        op->errors.push_back(block_error{index, h, std::move(why)});
      }
      for (auto& l : res->leases)
        landed.emplace_back(l.block_index, l);
      if (landed.empty() || op->info.error) {
        maybe_end(op);
        cv.notify_all();
        return;
      }
      for (auto& n : op->layer_batches)
        ++n;
      op->outstanding += cfg.geometry.layers;
      if (remote_part)
        op->remote_pending += cfg.geometry.layers;
    }
    auto& geo = cfg.geometry;
    auto page = geo.layer_bytes();
    auto batch_done = [this, op, layer_of = remote_part](uint32_t layer,
                                                         caf::error err) {
      std::lock_guard<std::mutex> guard{mtx};
      if (layer_of && op->remote_cut)
        return; // no longer counted
      --op->layer_batches[layer];
      --op->outstanding;
      if (layer_of)
        --op->remote_pending;
      if (err)
        fail(op, std::move(err));
      maybe_end(op);
      cv.notify_all();
    };
    for (uint32_t layer = 0; layer < geo.layers; ++layer) {
      if (remote_part) {
        write_batch wb;
        wb.tag = op->info.ticket;
        auto left = op->deadline - clock_type::now();
        wb.deadline_ns = std::max<int64_t>(
            1,
            std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
        for (auto& [index, lease] : landed) {
          auto dst = layers[layer].describe().subrange(
              uint64_t{pages_of[index]} * page, page);
          wb.ops.push_back(write_op{lease.region.region_id,
                                    lease.region.offset + layer * page,
                                    std::move(*dst)});
        }
        auto timeout = std::chrono::duration_cast<milliseconds>(left)
                       + remote_grace + remote_grace;
        self->request(writer, std::max(timeout, remote_grace), write_atom_v,
                      std::move(wb))
            .then(
                [batch_done, layer](batch_completion& c) {
                  batch_done(layer, std::move(c.error));
                },
                [batch_done, layer](caf::error& err) {
                  batch_done(layer, std::move(err));
                });
        continue;
      }
      auto& n = side == side_t::pe ? pe : de;
      bulk::batch b;
      b.deadline = op->deadline;
      b.tag = op->info.ticket;
      for (auto& [index, lease] : landed) {
        auto dst = layers[layer].describe().subrange(
            uint64_t{pages_of[index]} * page, page);
        b.writes.push_back(bulk::write_request{
            n->pool_registration, lease.region.offset + layer * page,
            std::move(*dst)});
      }
      n->bulk->post(std::move(b), [batch_done, layer](bulk::completion c) {
        batch_done(layer, std::move(c.error));
      });
    }
  }

  // Deployments: polls the deployment's view every view_period; sets the
  // decode node up (its reader, its bulk endpoint, the bulk link both ways)
  // when it appears or comes back under new details, and loses it (every
  // operation waiting for it fails at once, peer_lost) when it leaves the
  // view or the connection to it breaks (the hub monitors its reader and
  // bulk endpoint). A view request that fails (the scheduler node busy or
  // away) loses nothing: membership waits for the next answer.
  void start_hub(node_supervisor_actor sup) {
    hub = sys->spawn([this, sup](caf::event_based_actor* self) {
      self->set_down_handler([this](caf::down_msg& dm) {
        std::lock_guard<std::mutex> guard{mtx};
        if (remote == remote_phase::up
            && (dm.source == remote_reader.address()
                || dm.source == remote_bulk.address()))
          lose_remote(
              caf::make_error(transport::transport_errc::peer_lost,
                              "decode node " + remote_name
                                  + " disconnected: " + render(dm.reason)));
      });
      self->send(self, view_atom_v);
      return caf::behavior{
          [this, self, sup](view_atom) {
            self->request(sup, milliseconds{2000}, view_atom_v)
                .then(
                    [this, self](cluster_view& v) {
                      on_view(self, v);
                      self->delayed_send(self, view_period, view_atom_v);
                    },
                    [this, self](caf::error& err) {
                      {
                        std::lock_guard<std::mutex> guard{mtx};
                        if (remote != remote_phase::up)
                          remote_why = caf::make_error(
                              transport::transport_errc::peer_lost,
                              "the scheduler node does not answer: "
                                  + render(err));
                      }
                      self->delayed_send(self, view_period, view_atom_v);
                    });
          },
      };
    });
  }

  void on_view(caf::event_based_actor* self, const cluster_view& v) {
    const node_info* found = nullptr;
    for (auto& n : v.nodes)
      if (n.name == remote_name)
        found = &n;
    caf::actor reader;
    caf::actor bulk_hdl;
    if (found != nullptr)
      for (size_t i = 0;
           i < found->actors.size() && i < found->actor_names.size(); ++i) {
        if (found->actor_names[i] == "reader")
          reader = found->actors[i];
        if (found->actor_names[i] == "bulk")
          bulk_hdl = found->actors[i];
      }
    std::unique_lock<std::mutex> guard{mtx};
    if (found == nullptr || !reader || !bulk_hdl) {
      if (remote == remote_phase::up)
        lose_remote(caf::make_error(transport::transport_errc::peer_lost,
                                    "decode node " + remote_name
                                        + " left the deployment"));
      else if (found != nullptr)
        remote_why = caf::make_error(
            caf::sec::runtime_error,
            "decode node " + remote_name
                + " publishes no reader or bulk endpoint (an older node?)");
      return;
    }
    if (remote == remote_phase::up && found->endpoint.details == remote_details)
      return;
    if (remote == remote_phase::up)
      lose_remote(caf::make_error(transport::transport_errc::peer_lost,
                                  "decode node " + remote_name + " restarted"));
    if (connecting)
      return; // one set-up at a time (the next view retries)
    connecting = true;
    guard.unlock();
    // The bulk link: the decode node connects to this node (it writes into
    // the pages), this node to it (verbs needs both sides' details).
    endpoint_info mine;
    mine.node = pe->bulk->node();
    mine.backend = pe->bulk->caps().name;
    auto details = pe->bulk->details_for(remote_name);
    if (!details) {
      std::lock_guard<std::mutex> g{mtx};
      remote_why = details.error();
      connecting = false;
      return;
    }
    mine.details = *details;
    if (mine.backend == "tcp")
      mine.address.assign(details->begin(), details->end());
    auto rb = caf::actor_cast<bulk_endpoint_actor>(bulk_hdl);
    auto rr = caf::actor_cast<storage_reader_actor>(reader);
    auto their = found->endpoint.details;
    self->request(rb, milliseconds{5000}, connect_atom_v, std::move(mine))
        .then(
            [this, self, rb, rr, their](endpoint_info& info) {
              caf::error err;
              if (!info.details.empty())
                err = pe->bulk->connect(remote_name, info.details);
              std::lock_guard<std::mutex> g{mtx};
              connecting = false;
              if (err) {
                remote_why = err;
                return;
              }
              remote_reader = rr;
              remote_bulk = rb;
              self->monitor(rr);
              self->monitor(rb);
              remote_details = their;
              remote = remote_phase::up;
              remote_why = caf::none;
              cv.notify_all();
            },
            [this](caf::error& err) {
              std::lock_guard<std::mutex> g{mtx};
              connecting = false;
              remote_why = err;
            });
  }

  // The decode node's read queue in tokens: the embedded node's board, or
  // a deployment's node asked (a node that does not answer counts as a
  // full queue, so the PE side takes the load).
  uint64_t de_queue_tokens() {
    if (!deployed)
      return de->loads->read_queue().tokens;
    uint64_t out = UINT64_MAX / 4;
    storage_reader_actor reader;
    {
      std::lock_guard<std::mutex> guard{mtx};
      reader = remote_reader;
    }
    caf::scoped_actor self{*sys};
    self->request(reader, milliseconds{500}, queue_atom_v)
        .receive([&](read_queue_status& q) { out = q.tokens; },
                 [](caf::error&) {});
    return out;
  }

  void finish_load_info(const op_ptr& op) {
    // Called with mtx held when the load ended: the blocks before the first
    // failed one are in their pages.
    auto& i = op->info;
    if (i.error) {
      i.blocks_ok = 0;
      return;
    }
    auto first_bad = i.pe_blocks + i.de_blocks;
    for (auto& e : op->errors)
      first_bad = std::min(first_bad, e.index);
    i.blocks_ok = first_bad;
  }
};

namespace {

// A deployment as its nodes see it: the cluster file, the settings and the
// cluster they build from.
struct deployment_view {
  node::cluster_file cluster;
  config::settings settings;
  cluster::cluster_spec spec;
  transport::storage::store_config store;
  const node::node_entry* me = nullptr;
  const node::node_entry* decode = nullptr;
};

caf::expected<deployment_view> read_deployment(const deployment_config& dep) {
  deployment_view out;
  if (dep.cluster_file.empty())
    return bad_input("deployment.cluster_file: no cluster file given");
  auto cf = node::load_cluster(dep.cluster_file);
  if (!cf)
    return cf.error();
  out.cluster = std::move(*cf);
  config::load_request req;
  req.file = dep.config_file;
  for (auto& text : dep.sets)
    req.overrides.emplace_back(text, "--set");
  auto cfg = config::load(req);
  if (!cfg)
    return cfg.error();
  out.settings = std::move(*cfg);
  auto spec = node::deployment_spec(out.settings, out.cluster);
  if (!spec)
    return spec.error();
  out.spec = std::move(*spec);
  out.me = out.cluster.find(dep.node);
  if (out.me == nullptr || out.me->role != node::node_role::prefill)
    return bad_input("deployment.node: '" + dep.node
                     + "' is no prefill node of " + out.cluster.path
                     + " (the engine's own node must be one, with its "
                       "host and bulk_port)");
  auto de_name = dep.decode_node;
  if (de_name.empty()) {
    auto names = out.cluster.names_of(node::node_role::decode);
    if (names.empty())
      return bad_input("cluster file " + out.cluster.path
                       + " has no decode node (the DE path reads on one)");
    de_name = names.front();
  }
  out.decode = out.cluster.find(de_name);
  if (out.decode == nullptr || out.decode->role != node::node_role::decode)
    return bad_input("deployment.decode_node: '" + de_name
                     + "' is no decode node of " + out.cluster.path);
  auto& st = out.store;
  st.directory = out.cluster.storage_of(out.me->name);
  st.model_id = out.spec.model.name;
  st.geometry.layers = out.spec.model.layers;
  st.geometry.block_tokens = out.spec.block_tokens;
  st.geometry.bytes_per_token_layer =
      static_cast<uint32_t>(cluster::real_bytes_per_token_layer(out.spec));
  return out;
}

std::string to_text(const storage::kv_geometry& g) {
  return std::to_string(g.layers) + " layers x "
         + std::to_string(g.block_tokens) + " tokens x "
         + std::to_string(g.bytes_per_token_layer) + " bytes";
}

} // namespace

caf::expected<transport::storage::store_config>
deployment_store(const deployment_config& dep) {
  auto v = read_deployment(dep);
  if (!v)
    return v.error();
  return v->store;
}

kv_client::kv_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {
  // nop
}

kv_client::~kv_client() = default;

caf::expected<std::unique_ptr<kv_client>> kv_client::make(client_config cfg) {
  auto& geo = cfg.geometry;
  if (cfg.buffer_blocks == 0)
    return bad_input("buffer_blocks: a node's buffer must hold a block");
  if (cfg.kv_thread_nice < -20 || cfg.kv_thread_nice > 19)
    return bad_input("kv_thread_nice: " + std::to_string(cfg.kv_thread_nice)
                     + " is outside [-20, 19]");
  if (cfg.kv_thread_sched != bulk::tcp_cpu_sched::normal
      && cfg.kv_thread_sched != bulk::tcp_cpu_sched::batch
      && cfg.kv_thread_sched != bulk::tcp_cpu_sched::idle)
    return bad_input("kv_thread_sched: no CPU class numbered "
                     + std::to_string(static_cast<int>(cfg.kv_thread_sched)));
  if (cfg.deployment)
    return make_deployed(std::move(cfg));
  if (geo.layers == 0 || geo.block_tokens == 0
      || geo.bytes_per_token_layer == 0)
    return bad_input("the KV geometry needs layers, block_tokens and "
                     "bytes_per_token_layer > 0");
  if (cfg.store_dir.empty())
    return bad_input("store_dir: no block store directory given");
  auto p = std::make_unique<impl>(false);
  p->cfg = cfg;
  p->sys_cfg = std::make_unique<caf::actor_system_config>();
  add_message_types(*p->sys_cfg);
  p->sys = std::make_unique<caf::actor_system>(*p->sys_cfg);
  auto backend = storage::make_backend(
      storage::backend_config{storage::backend_kind::automatic, 8});
  if (!backend)
    return backend.error();
  auto store = storage::block_store::open(
      storage::store_config{cfg.store_dir, cfg.model_id, geo}, *backend);
  if (!store)
    return store.error();
  p->store = std::move(*store);
  // A cluster_spec of one prefill and one decode node whose nominal bytes
  // are the real ones (byte_scale 1), emulated time running in real time.
  auto& s = p->spec;
  s.prefill_nodes = 1;
  s.decode_nodes = 1;
  s.gpus_per_node = 1;
  s.block_tokens = geo.block_tokens;
  s.model.layers = geo.layers;
  s.model.kv_bytes_per_token_layer = geo.bytes_per_token_layer;
  s.snic_bytes_per_s = cfg.snic_bytes_per_s;
  s.dram_buffer_bytes = uint64_t{cfg.buffer_blocks} * geo.block_tokens
                        * cluster::kv_bytes_per_token(s.model);
  s.max_prompt_tokens = 0;
  s.reader_io_threads = 2;
  s.kv_thread_sched = cfg.kv_thread_sched;
  s.kv_thread_nice = cfg.kv_thread_nice;
  p->time = emulated_time{p->sys->clock().now(), 1.0};
  auto fabric = bulk::make_local_fabric();
  for (auto role : {engine_role::prefill, engine_role::decode}) {
    auto name = role == engine_role::prefill ? "pe0" : "de0";
    bulk::options bopts;
    bopts.backend = "local";
    bopts.node = name;
    bopts.default_deadline = cfg.default_deadline;
    auto be = bulk::make_local_backend(bopts, fabric);
    if (!be)
      return be.error();
    auto& f = cfg.decode_faults;
    if (role == engine_role::decode
        && (f.fail_after >= 0 || !f.drop_peer.empty() || f.delay.count() > 0
            || f.corrupt_byte))
      *be = bulk::make_fault_backend(std::move(*be), f);
    auto built = cluster::build_node(
        *p->sys, s, name, role, std::shared_ptr<bulk::backend>(std::move(*be)),
        p->store, p->time);
    if (!built)
      return built.error();
    for (auto& k : built->keep_alive)
      p->keep_alive.push_back(std::move(k));
    (role == engine_role::prefill ? p->pe : p->de) = built->node;
  }
  return std::unique_ptr<kv_client>{new kv_client(std::move(p))};
}

caf::expected<std::unique_ptr<kv_client>>
kv_client::make_deployed(client_config cfg) {
  auto& dep = *cfg.deployment;
  // One deadline for the scheduler node and the decode node together.
  auto until = clock_type::now() + dep.patience;
  if (dep.patience.count() < 0)
    return bad_input("deployment.patience: "
                     + std::to_string(dep.patience.count())
                     + " ms is negative");
  auto& f = cfg.decode_faults;
  if (f.fail_after >= 0 || !f.drop_peer.empty() || f.delay.count() > 0
      || f.corrupt_byte)
    return bad_input("decode_faults: faults are injected into the embedded "
                     "decode node only, not a deployment's");
  auto view = read_deployment(dep);
  if (!view)
    return view.error();
  auto& geo = cfg.geometry;
  auto& want = view->store.geometry;
  // A field left at its default is not given (the deployment's); any field
  // given must be the deployment's (block_tokens too once another is given).
  const storage::kv_geometry unset;
  bool any = geo.layers != unset.layers
             || geo.bytes_per_token_layer != unset.bytes_per_token_layer;
  std::pair<const char*, std::pair<uint32_t, uint32_t>> fields[] = {
      {"layers", {geo.layers, want.layers}},
      {"bytes_per_token_layer",
       {geo.bytes_per_token_layer, want.bytes_per_token_layer}},
      {"block_tokens", {geo.block_tokens, want.block_tokens}},
  };
  for (auto& [name, v] : fields) {
    bool given = std::string_view{name} == "block_tokens"
                     ? any || v.first != unset.block_tokens
                     : v.first != 0;
    if (given && v.first != v.second)
      return bad_input(
          "geometry." + std::string{name} + ": " + std::to_string(v.first)
          + " given, the deployment's is " + std::to_string(v.second)
          + " (its KV is " + to_text(want) + ")");
  }
  geo = want;
  cfg.store_dir = view->store.directory;
  cfg.model_id = view->store.model_id;
  cfg.snic_bytes_per_s = view->spec.snic_bytes_per_s;
  auto p = std::make_unique<impl>(true);
  p->dep_settings = std::move(view->settings);
  p->cluster = std::move(view->cluster);
  auto& cf = *p->cluster;
  auto& me = *cf.find(dep.node);
  p->remote_name = dep.decode_node.empty()
                       ? cf.names_of(node::node_role::decode).front()
                       : dep.decode_node;
  p->spec = view->spec;
  auto& s = p->spec;
  // The engine's node: a prefill node of the deployment whose DRAM buffer
  // holds buffer_blocks Full Blocks.
  s.dram_buffer_bytes = uint64_t{cfg.buffer_blocks} * geo.block_tokens
                        * cluster::kv_bytes_per_token(s.model);
  // Its KV threads run in the engine's process: the client's class, not
  // the deployment's (a node process's, idle by default).
  s.kv_thread_sched = cfg.kv_thread_sched;
  s.kv_thread_nice = cfg.kv_thread_nice;
  p->cfg = cfg;
  auto store = node::open_store(p->dep_settings, s, cfg.store_dir);
  if (!store)
    return store.error();
  p->store = std::move(*store);
  // The bulk transport as every node of the deployment has it
  // (transport.backend, the cluster's secret), listening on the entry's
  // bulk_port.
  auto bopts = node::node_bulk_options(p->dep_settings, cf, me);
  if (!bopts)
    return bopts.error();
  bopts->default_deadline = cfg.default_deadline;
  bopts->tcp_kv_sched = cfg.kv_thread_sched;
  bopts->tcp_kv_nice = cfg.kv_thread_nice;
  auto made = bulk::make_backend(*bopts, nullptr);
  if (!made)
    return made.error();
  std::shared_ptr<bulk::backend> be{std::move(made->chosen)};
  // The PE path and saves write from this node's buffer into its own
  // registered pages (and back): its transport reaches itself as a peer.
  auto own = be->details_for(me.name);
  if (!own)
    return own.error();
  if (auto err = be->connect(me.name, *own))
    return err;
  auto sys_cfg = std::make_unique<node::node_system_config>(p->dep_settings, cf,
                                                            std::cerr);
  if (sys_cfg->caf_error())
    return sys_cfg->caf_error();
  auto security = sys_cfg->security();
  p->sys_cfg = std::move(sys_cfg);
  p->sys = std::make_unique<caf::actor_system>(*p->sys_cfg);
  p->time = emulated_time{p->sys->clock().now(), s.time_scale};
  auto built = cluster::build_node(*p->sys, s, me.name, engine_role::prefill,
                                   be, p->store, p->time);
  if (!built)
    return built.error();
  for (auto& k : built->keep_alive)
    p->keep_alive.push_back(std::move(k));
  p->pe = built->node;
  std::unique_ptr<kv_client> out{new kv_client(std::move(p))};
  auto& d = *out->impl_;
  auto& sn = cf.scheduler_node();
  auto left = std::max(
      milliseconds{1},
      std::chrono::duration_cast<milliseconds>(until - clock_type::now()));
  auto sup_hdl = node::connect_actor(*d.sys, security, sn.host, sn.port, left);
  if (!sup_hdl)
    return caf::make_error(caf::sec::runtime_error,
                           "cannot reach the scheduler node " + sn.name + " at "
                               + sn.host + ":" + std::to_string(sn.port) + ": "
                               + render(sup_hdl.error()));
  d.start_hub(caf::actor_cast<node_supervisor_actor>(*sup_hdl));
  std::unique_lock<std::mutex> guard{d.mtx};
  if (!d.cv.wait_until(guard, until,
                       [&] { return d.remote == remote_phase::up; }))
    return caf::make_error(
        caf::sec::runtime_error,
        "decode node " + d.remote_name + " of " + cf.path
            + " did not answer within " + std::to_string(dep.patience.count())
            + " ms"
            + (d.remote_why ? ": " + render(d.remote_why) : std::string{}));
  return out;
}

const transport::storage::kv_geometry& kv_client::geometry() const {
  return impl_->cfg.geometry;
}

uint64_t kv_client::page_bytes() const {
  return impl_->cfg.geometry.layer_bytes();
}

uint32_t kv_client::pages() const {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  return impl_->pages;
}

uint64_t kv_client::lookup(std::vector<uint32_t> tokens) {
  auto& d = *impl_;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    ticket = d.next_ticket++;
    d.lookups.emplace(ticket, std::nullopt);
  }
  // The index lives in memory; the lookup runs on the actor system so the
  // caller (an engine's scheduler loop) never blocks on it.
  d.sys->spawn([&d, ticket, tokens = std::move(tokens)] {
    auto found = d.store->lookup(tokens);
    std::lock_guard<std::mutex> guard{d.mtx};
    d.lookups[ticket] = prefix_hit{std::move(found.blocks), found.hit_tokens};
    d.cv.notify_all();
  });
  return ticket;
}

std::optional<caf::expected<prefix_hit>>
kv_client::lookup_result(uint64_t ticket) {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  auto i = d.lookups.find(ticket);
  if (i == d.lookups.end())
    return caf::expected<prefix_hit>{
        bad_input("no lookup with ticket " + std::to_string(ticket))};
  if (!i->second)
    return std::nullopt;
  auto out = std::move(i->second);
  d.lookups.erase(i);
  return out;
}

caf::error kv_client::register_kv(const std::vector<kv_layer_memory>& layers) {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  if (!d.layers.empty())
    return bad_input("KV memory is already registered (once per client)");
  auto& geo = d.cfg.geometry;
  if (layers.size() != geo.layers)
    return bad_input(std::to_string(layers.size()) + " layers given, the "
                     + "geometry has " + std::to_string(geo.layers));
  auto page = geo.layer_bytes();
  uint64_t pages = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& m = layers[l];
    if (!m.base || m.bytes == 0 || m.bytes % page != 0)
      return bad_input("layer " + std::to_string(l) + ": "
                       + std::to_string(m.bytes)
                       + " bytes is no whole number of pages of "
                       + std::to_string(page) + " bytes");
    auto n = m.bytes / page;
    if (l > 0 && n != pages)
      return bad_input("layer " + std::to_string(l) + " has "
                       + std::to_string(n) + " pages, layer 0 has "
                       + std::to_string(pages));
    pages = n;
  }
  if (pages > UINT32_MAX)
    return bad_input("more than 2^32 pages per layer");
  // Device pages first (each checked, a staging area set up), so that a
  // refusal leaves nothing registered.
  std::vector<std::unique_ptr<gpu::device_pages>> devs(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& m = layers[l];
    if (m.kind == memory_kind::host)
      continue;
    if (m.kind != memory_kind::cuda)
      return bad_input("layer " + std::to_string(l) + ": memory of kind "
                       + to_string(m.kind));
    auto dev = gpu::device_pages::make(m.base, m.bytes);
    if (!dev) {
      auto what =
          "layer " + std::to_string(l) + ": " + gpu::describe(dev.error());
      // The same code and category, its context prefixed with the layer.
      return caf::error{dev.error().code(), dev.error().category(),
                        caf::make_message(std::move(what))};
    }
    devs[l] = std::move(*dev);
  }
  // Device pages go to the NIC themselves where the engine node's transport
  // is verbs: a dma-buf (ibv_reg_dmabuf_mr), else the device pointer
  // (ibv_reg_mr, which nvidia-peermem serves); otherwise, or when both are
  // refused, they are staged through their pinned host area, and
  // kv_memory_path says why.
  auto transport_name = d.pe->bulk->caps().name;
  std::vector<bulk::local_registration> regs;
  std::vector<bool> direct(layers.size(), false);
  std::vector<std::string> modes(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& m = layers[l];
    if (!devs[l]) {
      auto reg = d.pe->bulk->register_region(m.base, m.bytes);
      if (!reg)
        return std::move(reg.error());
      regs.push_back(std::move(*reg));
      modes[l] = "host pages: written in place by the bulk transport";
      continue;
    }
    auto& dev = *devs[l];
    std::optional<bulk::local_registration> in_place;
    std::string why;
    if (transport_name != "verbs") {
      why = "the engine node's bulk transport is " + transport_name
            + ", which writes host memory";
    } else {
      auto buf = dev.export_dmabuf();
      if (buf) {
        auto reg = d.pe->bulk->register_region(
            m.base, m.bytes, bulk::memory_kind::device, buf->fd());
        if (reg) {
          in_place = std::move(*reg);
          modes[l] = "zero-copy: the NIC writes device memory (dma-buf)";
        } else {
          why = "ibv_reg_dmabuf_mr: " + actors::render(reg.error());
        }
      } else {
        why = "dma-buf export: " + gpu::describe(buf.error());
      }
      if (!in_place) {
        auto reg = d.pe->bulk->register_region(m.base, m.bytes);
        if (reg) {
          in_place = std::move(*reg);
          modes[l] = "zero-copy: the NIC writes device memory (ibv_reg_mr on "
                     "the device pointer, nvidia-peermem; "
                     + why + ")";
        } else {
          why += "; ibv_reg_mr on the device pointer (nvidia-peermem): "
                 + actors::render(reg.error());
        }
      }
      // The NIC's writes must be orderable before the pages are read.
      if (in_place)
        if (auto err = dev.order_remote_writes()) {
          in_place.reset();
          why = "RDMA writes into the device cannot be ordered: "
                + gpu::describe(err);
        }
    }
    if (in_place) {
      regs.push_back(std::move(*in_place));
      direct[l] = true;
      modes[l] = "device pages on " + dev.describe() + ": " + modes[l];
      continue;
    }
    auto reg = d.pe->bulk->register_region(dev.staging(), m.bytes);
    if (!reg)
      return std::move(reg.error());
    regs.push_back(std::move(*reg));
    modes[l] = "device pages on " + dev.describe()
               + ": staged through pinned host memory (" + why + ")";
  }
  // One line when every layer is reached alike, else one per layer.
  std::string path = modes[0];
  if (std::any_of(modes.begin(), modes.end(),
                  [&](const std::string& x) { return x != modes[0]; })) {
    path.clear();
    for (size_t l = 0; l < modes.size(); ++l)
      path += (l > 0 ? "; " : "") + std::string{"layer "} + std::to_string(l)
              + ": " + modes[l];
  }
  d.layers = std::move(regs);
  d.direct = std::move(direct);
  d.device_layers = std::move(devs);
  d.memory_path = std::move(path);
  d.pages = static_cast<uint32_t>(pages);
  return caf::none;
}

caf::expected<uint64_t> kv_client::start_load(load_request req) {
  auto& d = *impl_;
  auto n = static_cast<uint32_t>(req.blocks.size());
  op_ptr op;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (req.pages.size() != req.blocks.size())
      return bad_input(std::to_string(req.blocks.size()) + " blocks but "
                       + std::to_string(req.pages.size()) + " pages");
    auto admitted = d.admit(finished_op::kind_t::load, req.request_id,
                            req.pages, req.deadline);
    if (!admitted)
      return std::move(admitted.error());
    op = std::move(*admitted);
    op->layer_batches.assign(d.cfg.geometry.layers, 0);
    if (d.has_device_layers()) {
      op->pages = req.pages;
      op->landed.assign(d.cfg.geometry.layers, landing::pending);
    }
  }
  // The path: the global scheduler's policy over both nodes' read queues
  // (the same function its fetch applies), unless the request forces one.
  // A deployment's decode node that is not up reads nothing: a forced DE
  // load fails at once, the others read on the PE side.
  auto mode = d.cfg.reads;
  uint32_t k = n;
  auto bt = d.cfg.geometry.block_tokens;
  auto rate = static_cast<double>(d.cfg.snic_bytes_per_s)
              / static_cast<double>(cluster::kv_bytes_per_token(d.spec.model));
  caf::error de_down;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (d.deployed && d.remote != remote_phase::up)
      de_down = d.remote == remote_phase::lost && d.remote_why
                    ? d.remote_why
                    : caf::make_error(transport::transport_errc::peer_lost,
                                      "decode node " + d.remote_name
                                          + " is not reachable");
  }
  switch (req.path) {
    case load_path::pe:
      k = n;
      break;
    case load_path::de:
      k = 0;
      break;
    case load_path::split:
      mode = scheduler::read_mode::split;
      [[fallthrough]];
    case load_path::automatic:
      if (de_down) {
        k = n;
        break;
      }
      k = scheduler::plan_reads(mode, d.pe->loads->read_queue().tokens, rate,
                                d.de_queue_tokens(), rate, n, bt)
              .pe_side_blocks;
      break;
  }
  auto blocks =
      std::make_shared<std::vector<block_hash>>(std::move(req.blocks));
  auto pages = std::make_shared<std::vector<uint32_t>>(std::move(req.pages));
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    op->info.pe_blocks = k;
    op->info.de_blocks = n - k;
    if (k < n && de_down) {
      d.fail(op, de_down);
      op->info.pe_blocks = 0;
      op->info.de_blocks = 0;
      k = n = 0; // nothing starts
    }
    for (uint32_t part : {k, n - k})
      if (part > 0) {
        ++op->reads_pending;
        ++op->outstanding;
      }
    if (n > k && d.remote_side(side_t::de)) {
      ++op->remote_pending;
      ++op->remote_reads;
    }
    d.maybe_end(op); // nothing to read
  }
  for (auto side : {side_t::pe, side_t::de}) {
    uint32_t first = side == side_t::pe ? 0 : k;
    uint32_t last = side == side_t::pe ? k : n;
    if (first == last)
      continue;
    read_request rr;
    rr.request_id = op->info.ticket;
    rr.first_block = first;
    rr.blocks.assign(blocks->begin() + first, blocks->begin() + last);
    rr.tokens = (last - first) * bt;
    bool remote_part;
    storage_reader_actor reader;
    {
      std::lock_guard<std::mutex> guard{d.mtx};
      remote_part = d.remote_side(side);
      reader = d.reader_of(side);
      (side == side_t::pe ? op->pe_reader : op->de_reader) = reader;
    }
    // The decode node's reader frees what this process holds of its buffer
    // when the hub goes down (this process dies, or the link to it breaks).
    if (remote_part)
      rr.holder = d.hub;
    // A local reader always answers: no timeout, so a reply after the
    // deadline still comes and its leases go back (maybe_end abandons the
    // read at the deadline). A remote one may be gone: its requester waits
    // late_reply_window past the deadline, linked to the hub so that the
    // client's destruction ends it.
    auto timeout = remote_part
                       ? caf::duration{std::chrono::duration_cast<milliseconds>(
                                           op->deadline - clock_type::now())
                                       + late_reply_window}
                       : caf::infinite;
    d.sys->spawn([&d, op, side, first, blocks, pages, reader, timeout,
                  remote_part,
                  rr = std::move(rr)](caf::event_based_actor* self) mutable {
      if (remote_part && d.hub)
        self->link_to(d.hub);
      self->request(reader, timeout, read_atom_v, std::move(rr))
          .then(
              [&d, self, op, side, first, blocks, pages](read_completion& c) {
                d.on_read(op, side, first, *blocks, *pages, std::move(c), self);
              },
              [&d, self, op, side, first, blocks, pages](caf::error& err) {
                d.on_read(op, side, first, *blocks, *pages, std::move(err),
                          self);
              });
    });
  }
  return op->info.ticket;
}

caf::error kv_client::wait_for_layer(uint64_t ticket, uint32_t layer) {
  auto& d = *impl_;
  std::unique_lock<std::mutex> guard{d.mtx};
  auto i = d.ops.find(ticket);
  if (i == d.ops.end() || i->second->info.kind != finished_op::kind_t::load)
    return bad_input("no load with ticket " + std::to_string(ticket));
  if (layer >= d.cfg.geometry.layers)
    return bad_input("layer " + std::to_string(layer) + " of a model with "
                     + std::to_string(d.cfg.geometry.layers) + " layers");
  auto op = i->second;
  auto ready = [&] {
    return op->info.error || op->phase == op_phase::ended
           || (op->reads_pending == 0 && op->layer_batches[layer] == 0);
  };
  if (!d.cv.wait_until(guard, op->deadline, ready)) {
    d.fail(op, caf::make_error(caf::sec::request_timeout,
                               "load " + std::to_string(ticket) + " layer "
                                   + std::to_string(layer)
                                   + " not loaded by its deadline"));
    d.maybe_end(op);
  }
  // Device pages: the layer is ready once its staged bytes are copied in.
  d.land(op, layer, guard);
  return op->info.error;
}

caf::expected<uint64_t> kv_client::start_save(save_request req) {
  auto& d = *impl_;
  auto& geo = d.cfg.geometry;
  auto n = static_cast<uint32_t>(req.pages.size());
  auto hashes = storage::block_hashes(req.tokens, geo.block_tokens);
  op_ptr op;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (uint64_t{req.first_block} + n > hashes.size())
      return bad_input("blocks " + std::to_string(req.first_block) + ".."
                       + std::to_string(req.first_block + n)
                       + " of a prompt of " + std::to_string(hashes.size())
                       + " full blocks");
    auto admitted = d.admit(finished_op::kind_t::save, req.request_id,
                            req.pages, req.deadline);
    if (!admitted)
      return std::move(admitted.error());
    op = std::move(*admitted);
    // The reservation counts as a read: abandoned at the deadline if not
    // answered (maybe_end), its late answer only hands the slots back.
    op->outstanding = n > 0 ? 1 : 0;
    op->reads_pending = op->outstanding;
    op->pe_reader = d.pe->reader;
    d.maybe_end(op);
  }
  if (n == 0)
    return op->info.ticket;
  // Device pages: staged device -> pinned host before anything is written.
  for (size_t l = 0; l < d.device_layers.size(); ++l) {
    auto* dev = d.device_layers[l].get();
    if (dev == nullptr || d.direct[l])
      continue; // host memory, or device memory the NIC reads itself
    if (auto err = dev->to_host(d.page_chunks(req.pages))) {
      std::lock_guard<std::mutex> guard{d.mtx};
      d.fail(op, caf::make_error(
                     caf::sec::runtime_error,
                     "layer " + std::to_string(l) + ": staging the pages from "
                         + dev->describe() + " failed: " + gpu::describe(err)));
      op->outstanding = 0;
      op->reads_pending = 0;
      d.maybe_end(op);
      return op->info.ticket;
    }
  }
  reserve_request rr;
  rr.request_id = op->info.ticket;
  for (uint32_t b = 0; b < n; ++b)
    rr.block_indices.push_back(req.first_block + b);
  // The reader drops the reservation if it cannot serve it by the deadline
  // (no slot is taken for a save that gave up).
  rr.timeout_ns =
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                               op->deadline - clock_type::now())
                               .count());
  // Reserve staging slots in the engine node's buffer, write the pages into
  // them over the transport (one batch), then persist each block.
  d.sys->spawn([&d, op, rr = std::move(rr), hashes = std::move(hashes),
                first = req.first_block,
                pages = std::move(req.pages)](caf::event_based_actor* self) {
    auto end_with = [&d, op](caf::error err) {
      std::lock_guard<std::mutex> guard{d.mtx};
      d.fail(op, std::move(err));
      --op->outstanding;
      d.maybe_end(op);
    };
    // No timeouts on the reader's requests: a persist reads its staging
    // slot until it replies, so the slot is released only after the reply;
    // a reservation answered after the save ended gives its slots back.
    self->request(d.pe->reader, caf::infinite, reserve_atom_v, rr)
        .then(
            [&d, self, op, end_with, hashes, first, pages](read_completion& c) {
              {
                std::lock_guard<std::mutex> guard{d.mtx};
                if (op->phase == op_phase::ended) {
                  release_leases(op->pe_reader, lease_ids(c));
                  return;
                }
                --op->reads_pending;
                for (auto& l : c.leases)
                  op->pe_leases.push_back(l.lease_id);
              }
              if (c.leases.size() != pages.size())
                return end_with(caf::make_error(
                    storage::storage_errc::over_budget,
                    "reserved " + std::to_string(c.leases.size()) + " of "
                        + std::to_string(pages.size()) + " staging slots"));
              auto& geo = d.cfg.geometry;
              auto page = geo.layer_bytes();
              bulk::batch b;
              b.deadline = op->deadline;
              b.tag = op->info.ticket;
              for (size_t i = 0; i < pages.size(); ++i)
                for (uint32_t layer = 0; layer < geo.layers; ++layer) {
                  auto dst = c.leases[i].region.subrange(layer * page, page);
                  if (!dst)
                    return end_with(std::move(dst.error()));
                  b.writes.push_back(bulk::write_request{
                      &d.layers[layer], uint64_t{pages[i]} * page,
                      std::move(*dst)});
                }
              auto leases = c.leases;
              auto persist = [&d, self, op, end_with, hashes, first,
                              leases](caf::error err) {
                if (err)
                  return end_with(std::move(err));
                auto& geo = d.cfg.geometry;
                {
                  std::lock_guard<std::mutex> guard{d.mtx};
                  op->outstanding += static_cast<uint32_t>(leases.size());
                }
                for (size_t i = 0; i < leases.size(); ++i) {
                  auto index = first + static_cast<uint32_t>(i);
                  persist_request pr;
                  pr.hash = hashes[index];
                  pr.parent =
                      index == 0 ? transport::root_hash : hashes[index - 1];
                  pr.tokens = geo.block_tokens;
                  pr.source =
                      *leases[i].region.subrange(0, geo.payload_bytes());
                  self->request(d.pe->reader, caf::infinite, persist_atom_v, pr)
                      .then([end_with](block_hash) { end_with(caf::none); },
                            [end_with](caf::error& err) {
                              end_with(std::move(err));
                            });
                }
                end_with(caf::none); // the staging write
              };
              // The completion arrives on the backend's thread; persisting
              // goes back to this actor.
              d.pe->bulk->post(std::move(b), [hdl = caf::actor{self}](
                                                 bulk::completion done) {
                caf::anon_send(hdl, batch_completion{done.tag, done.bytes,
                                                     done.failed_ops,
                                                     std::move(done.error)});
              });
              self->become([self, persist](batch_completion& done) {
                self->unbecome(); // alive only while persists are pending
                persist(std::move(done.error));
              });
            },
            [&d, op, end_with](caf::error& err) {
              {
                std::lock_guard<std::mutex> guard{d.mtx};
                if (op->phase == op_phase::ended)
                  return; // abandoned at the deadline already
                --op->reads_pending;
              }
              end_with(std::move(err));
            });
  });
  return op->info.ticket;
}

caf::expected<finished_op> kv_client::wait(uint64_t ticket) {
  auto& d = *impl_;
  std::unique_lock<std::mutex> guard{d.mtx};
  auto i = d.ops.find(ticket);
  if (i == d.ops.end())
    return bad_input("no load or save with ticket " + std::to_string(ticket));
  auto op = i->second;
  auto ended = [&] { return op->phase == op_phase::ended; };
  if (!d.cv.wait_until(guard, op->deadline, ended)) {
    // Past the deadline: maybe_end abandons reads, and a deployment's
    // decode node's parts after the grace.
    while (!ended()) {
      d.maybe_end(op);
      d.cv.wait_for(guard, milliseconds{20}, ended);
    }
  }
  d.land_all(op, guard);
  if (op->info.kind == finished_op::kind_t::load)
    d.finish_load_info(op);
  return op->info;
}

std::vector<finished_op> kv_client::finished() {
  auto& d = *impl_;
  std::vector<finished_op> out;
  std::unique_lock<std::mutex> guard{d.mtx};
  // Ended loads into device pages are reported once their layers landed.
  std::vector<op_ptr> ended;
  for (auto& kv : d.ops) {
    d.maybe_end(kv.second);
    if (kv.second->phase == op_phase::ended && !kv.second->landed.empty())
      ended.push_back(kv.second);
  }
  for (auto& op : ended)
    d.land_all(op, guard);
  for (auto i = d.ops.begin(); i != d.ops.end();) {
    d.maybe_end(i->second); // abandons reads past their deadlines
    if (i->second->phase != op_phase::ended || !d.landed(*i->second)) {
      ++i; // running, or it ended while another load was copied in
      continue;
    }
    if (i->second->info.kind == finished_op::kind_t::load)
      d.finish_load_info(i->second);
    out.push_back(i->second->info);
    i = d.ops.erase(i);
  }
  return out;
}

std::vector<block_error> kv_client::load_errors(uint64_t ticket) const {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  auto i = d.ops.find(ticket);
  if (i == d.ops.end())
    return {};
  auto out = i->second->errors;
  std::sort(out.begin(), out.end(),
            [](const block_error& x, const block_error& y) {
              return x.index < y.index;
            });
  return out;
}

std::string kv_client::kv_memory_path() const {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  return impl_->memory_path;
}

std::string kv_client::block_file(block_hash hash) const {
  return impl_->store->path_of(hash);
}

} // namespace dualpath::actors::client
