// The prefill engine's state (internal to actors/engines/prefill/): the
// requests (reads, admissions, packing, fetches) and the step its layer
// streamer runs (actors/engines/streamer/). See prefill_engine.hpp for the
// whole design.
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
#include "actors/protocol/layer_streamer_actor.hpp"
#include "actors/protocol/prefill_engine_actor.hpp"

// Private atoms: messages the engine sends itself (timers, completions from
// backend threads); they never cross a process.
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, fetch_tick_atom,
             "petick")
CAF_ADD_ATOM(dualpath_actors, dualpath::actors::prefill_atoms, kick_atom,
             "pekick")

namespace dualpath::actors::prefill {

using namespace dualpath::actors::prefill_atoms;

using time_point = emulated_time::time_point;

// The engine's whole interface: the public one, its layer streamer's
// reports, and its private messages: the fetch timer and a due step start.
using impl_actor =
    prefill_engine_actor::extend_with<layer_streamer_reports>::extend<
        caf::reacts_to<fetch_tick_atom>, caf::reacts_to<kick_atom>>;

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
  bool failed = false;      // failed inside a step: removed at its end
  // Real plane: the leases of the PE-side blocks used (index < pe_side),
  // named in each step of the request for the streamer to load from.
  std::vector<buffer_lease> pe_blocks;
  // Released once the request's last layer is in GPU memory (pushed from
  // the buffer: the KV no longer needs the DRAM), or when it leaves.
  std::vector<uint64_t> leases;
  uint64_t bytes_read_pe = 0; // nominal
  time_point placed_at{};
  // The round trip of the fetch that brought it (-1: pushed, none).
  int64_t control_rtt_ns = -1;
};

struct pe_lane {
  std::deque<uint64_t> fifo; // its requests in placement order
  uint32_t seq = 0;
  uint64_t tok = 0;
};

// A request's chunk of the running step: new tokens [first, first + tokens).
struct running_chunk {
  uint64_t job = 0;
  uint32_t first = 0;
  uint32_t tokens = 0;
};

// The step the streamer runs: its chunks in lane order.
struct running_step {
  uint64_t id = 0;
  std::vector<running_chunk> chunks;
  bool loaded = false; // its last layer is in GPU memory (step_loaded)
};

struct prefill_state {
  engine_config cfg;
  std::vector<pe_lane> lanes;
  std::unordered_map<uint64_t, pe_job> jobs;
  layer_streamer_actor streamer;
  // The step the streamer runs, and the one packed while its last layers
  // compute and send (once it is loaded): it runs when `step` is done.
  std::unique_ptr<running_step> step;
  std::unique_ptr<running_step> next;
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

/// Starts the next step if none runs (or packs the one after the running
/// step once that one is loaded), and the admissions ahead.
void pump(self_ptr self);

/// After a step: its requests' chunks are done; finished ones leave.
void step_finished(self_ptr self, const running_step& step);

/// The step's last layer is in GPU memory: the requests whose last chunk it
/// holds give their PE-side buffer slots back.
void release_loaded(self_ptr self, const running_step& step);

} // namespace dualpath::actors::prefill
