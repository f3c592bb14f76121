// The prefill engine's state, shared by its two halves (internal to
// actors/engines/prefill/): prefill_engine.cpp keeps the requests (reads,
// admissions, packing, fetches) and prefill_step.cpp runs one step of the
// node's GPUs layer by layer. See prefill_engine.hpp for the whole design.
//
// Thread safety: the actor's own state, used from its handlers only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include <caf/type_id.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/engines/engine_common.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"
#include "gpu/device.hpp"
#include "gpu/host_memory.hpp"
#include "transport/bulk/backend.hpp"

// Private atoms: messages the engine sends itself (timers, completions from
// backend threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, fetch_tick_atom,
             "petick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, computed_atom,
             "pecomputed")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, sent_atom,
             "pesent")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, posted_atom,
             "peposted")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, loaded_atom,
             "peloaded")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, kick_atom,
             "pekick")

namespace dualpath::actors::prefill {

using namespace dualpath::actors::prefill_atoms;

using time_point = emulated_time::time_point;

// The engine's whole interface: the public one plus its private messages:
// a layer computed, a layer's sends done, a step's last layer in GPU memory
// (all in emulated time), and a bulk batch's completion from a backend
// thread (step, layer, whether it was a load's loopback copy or a send,
// error).
using impl_actor = prefill_engine_actor::extend<
    caf::reacts_to<fetch_tick_atom>, caf::reacts_to<loaded_atom, uint64_t>,
    caf::reacts_to<kick_atom>,
    caf::reacts_to<computed_atom, uint64_t, uint32_t>,
    caf::reacts_to<sent_atom, uint64_t, uint32_t>,
    caf::reacts_to<posted_atom, uint64_t, uint32_t, bool, caf::error>>;

// Where a request is (see prefill_engine.hpp).
enum class pe_phase : uint8_t {
  reading,
  queued,
  admitting,
  ready,
  prefilling,
};

struct pe_job {
  uint64_t id = 0; // the request id (its attempt in the top bits)
  pe_phase phase = pe_phase::reading;
  assignment a;
  uint32_t lane = 0;
  uint32_t tokens = 0;
  read_plan plan; // plan_for(mode, the scheduler's plan)
  std::vector<block_hash> hashes;
  read_completion pe_read; // PE-side blocks (leases)
  decode_slot slot;        // the decode node's regions
  // After admission: the hits used (read errors shrink them).
  uint32_t hit_tokens = 0;
  uint32_t pe_side_tokens = 0;
  uint32_t done_tokens = 0; // tokens whose KV exists (hits, chunks done)
  bool hits_sent = false;   // PE-side hits went to the decode node
  bool failed = false;      // failed inside a step: skipped from then on
  // Real plane: the payload of every PE-side block (index < pe_side).
  std::vector<const std::byte*> pe_block;
  // Released once the request's last layer is in GPU memory (pushed from
  // the buffer: the KV no longer needs the DRAM), or when it leaves.
  std::vector<uint64_t> leases;
  uint64_t bytes_read_pe = 0; // nominal
  time_point placed_at{};
};

// One GPU's staging: host memory mirroring its HBM for KV (real bytes),
// pinned with its device and registered with the node's bulk transport once.
struct pe_staging {
  gpu::host_memory memory;
  uint64_t size = 0;
  gpu::pinned_host pinned;
  gpu::stream stream;
  transport::bulk::local_registration registration;
};

struct pe_lane {
  std::deque<uint64_t> fifo; // its requests in placement order
  uint32_t seq = 0;
  uint64_t tok = 0;
  pe_staging staging;
};

// One request's part of one step on one GPU: `tokens` new tokens from
// `first` on (first = the tokens whose KV it attends to: cached).
struct step_chunk {
  uint64_t job = 0;
  uint32_t first = 0;
  uint32_t tokens = 0;
  bool send_hits = false; // the request's first chunk sends the PE-side hits
  uint64_t offset = 0;    // byte offset in the GPU's layer slot
};

struct step_lane {
  std::vector<step_chunk> chunks;
  uint64_t layer_bytes = 0; // real bytes of one layer slot
};

struct step_layer {
  uint32_t pushes_pending = 0; // push replies (and loopback H2D) awaited
  // The decode engines whose push reply is awaited: one lost meanwhile
  // never answers (a node lost behind the scheduler node), so its loss
  // settles the push (lost_decode_engine).
  std::vector<caf::actor> push_targets;
  bool loading = false;
  bool load_known = false; // every load answered: ready_at is final
  time_point ready_at{};
  bool compute_scheduled = false;
  time_point compute_end{};
  bool computed = false;
  uint32_t posts_pending = 0; // bulk sends awaited
  time_point send_done{};
  bool sent = false;
  std::vector<gpu::device_buffer> gpu; // per lane (real plane)
};

struct prefill_step_run {
  uint64_t id = 0;
  std::vector<step_lane> lanes;
  std::vector<step_layer> layers;
  uint32_t window = 1;
  double layer_s = 0;
  uint32_t next_load = 0;
  uint32_t next_compute = 0;
  uint32_t first_live = 0; // oldest layer not yet sent
  time_point began{};
};

struct prefill_state {
  engine_config cfg;
  std::vector<pe_lane> lanes;
  std::unordered_map<uint64_t, pe_job> jobs;
  std::unique_ptr<prefill_step_run> step;
  uint64_t next_step = 1;
  // A step start is due: it packs after the messages already queued, so
  // requests ready at the same instant share the step.
  bool kicked = false;
  static inline const char* name = "prefill_engine";
};

using self_ptr = impl_actor::stateful_pointer<prefill_state>;

// -- prefill_engine.cpp -------------------------------------------------------

/// A request failed (its decode node dropped, a transfer failed): tells the
/// decode node and the scheduler and removes it.
void fail_job(self_ptr self, uint64_t id, const caf::error& err);

/// Starts the next step if none runs, and the admissions ahead.
void pump(self_ptr self);

/// After a step: its requests' chunks are done; finished ones leave.
void step_finished(self_ptr self, const prefill_step_run& step);

/// The step's last layer is in GPU memory: the requests whose last chunk it
/// holds give their PE-side buffer slots back.
void release_loaded(self_ptr self, const prefill_step_run& step);

// -- prefill_step.cpp ---------------------------------------------------------

/// Runs `step` (packed already): starts its first layers' loads.
void run_step(self_ptr self, std::unique_ptr<prefill_step_run> step);

void on_computed(self_ptr self, uint64_t step, uint32_t layer);
void on_loaded(self_ptr self, uint64_t step);
void on_sent(self_ptr self, uint64_t step, uint32_t layer);
void on_posted(self_ptr self, uint64_t step, uint32_t layer, bool load,
               caf::error err);

/// A decode engine was lost: pushes awaited from it are settled as failed
/// (its requests fail), so the step goes on.
void lost_decode_engine(self_ptr self, const caf::actor_addr& de);

} // namespace dualpath::actors::prefill
