// The message vocabulary shared by dualpath's actors. Every message is a plain
// struct with inspect() beside it, so deep_to_string shows every field and the
// binary serializer carries it between nodes. Messages carry descriptors of
// bytes (remote_region), never the KV bytes themselves: bulk bytes travel over
// the bulk transport.
//
// Field units: times are nanoseconds of the actor clock (emulated time when a
// time scale is configured), sizes are bytes, token counts are tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include "actors/protocol/token_list.hpp"
#include "transport/types.hpp"

namespace dualpath::actors {

using transport::block_hash;
using transport::remote_region;

// -- identities ---------------------------------------------------------------

/// Role of an engine.
enum class engine_role : uint8_t {
  prefill = 0,
  decode = 1,
};

std::string to_string(engine_role x);

/// Names one engine in the cluster: the node it runs on, its role and its rank
/// inside the node's engine group (rank 0 is the group leader).
struct engine_id {
  std::string node;
  engine_role role = engine_role::prefill;
  uint32_t rank = 0;

  friend bool operator==(const engine_id& x, const engine_id& y) {
    return x.node == y.node && x.role == y.role && x.rank == y.rank;
  }
  friend bool operator!=(const engine_id& x, const engine_id& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_id& x) {
  return f(caf::meta::type_name("engine_id"), x.node, x.role, x.rank);
}

// -- requests -----------------------------------------------------------------

/// One turn of one agent: the prompt's token ids (all earlier appends and
/// generations plus the new append) and how many tokens to generate.
struct request_spec {
  uint64_t id = 0;         ///< Unique per run.
  uint64_t agent = 0;      ///< Trajectory (agent) id.
  uint32_t turn = 0;       ///< Turn index inside the trajectory.
  token_list tokens;       ///< Prompt token ids (shared buffer).
  uint32_t gen_tokens = 0; ///< Tokens to generate in decode.
  /// The token ids the emulated model generates (gen_tokens of them, from
  /// the trace), so the decode engine can persist their KV blocks.
  std::vector<uint32_t> output_tokens;
  int64_t arrival_ns = 0; ///< When the request became ready (emulated).
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_spec& x) {
  return f(caf::meta::type_name("request_spec"), x.id, x.agent, x.turn,
           x.tokens, x.gen_tokens, x.output_tokens, x.arrival_ns);
}

/// Which side reads a request's hit blocks from storage. A split plan reads
/// blocks [0, pe_side_blocks) on the prefill side and the rest on the decode
/// side.
struct read_plan {
  uint32_t hit_blocks = 0;     ///< Leading Full Blocks found in storage.
  uint32_t pe_side_blocks = 0; ///< How many of them the prefill node reads.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, read_plan& x) {
  return f(caf::meta::type_name("read_plan"), x.hit_blocks, x.pe_side_blocks);
}

/// The scheduler's decision for one request.
struct assignment {
  request_spec request;
  engine_id prefill;
  engine_id decode;
  read_plan plan;
  caf::actor prefill_actor; ///< Handle of `prefill`.
  caf::actor decode_actor;  ///< Handle of `decode`.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, assignment& x) {
  return f(caf::meta::type_name("assignment"), x.request, x.prefill, x.decode,
           x.plan, x.prefill_actor, x.decode_actor);
}

/// The reply to a group leader's fetch: zero or more assignments.
struct work_batch {
  std::vector<assignment> items;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_batch& x) {
  return f(caf::meta::type_name("work_batch"), x.items);
}

/// Per-request outcome, reported by the decode engine when the request ends.
struct request_result {
  uint64_t id = 0;
  engine_id prefill;
  engine_id decode;
  int64_t ttft_ns = 0;        ///< Arrival to first token.
  int64_t ttst_ns = 0;        ///< Arrival to second token.
  int64_t tpot_ns = 0;        ///< Mean time per output token after the first.
  int64_t done_ns = 0;        ///< Completion time.
  uint64_t bytes_read_pe = 0; ///< Storage bytes read on the prefill side.
  uint64_t bytes_read_de = 0; ///< Storage bytes read on the decode side.
  uint64_t bytes_compute_net = 0; ///< Bytes over the compute network.
  uint32_t blocks_verified = 0;   ///< Blocks checked byte-exact.
  uint32_t verify_failures = 0;   ///< Blocks whose bytes did not match.
  uint32_t recomputed_blocks = 0; ///< Hit blocks turned into misses by errors.
  uint32_t reroutes = 0;          ///< Times the request was re-queued.
  /// Compute-network bytes (nominal) by direction: prefill -> decode (layer
  /// KV after each layer) and decode -> prefill (DE-side hit Layer Blocks).
  uint64_t bytes_pe_to_de = 0;
  uint64_t bytes_de_to_pe = 0;
  uint32_t blocks_persisted = 0; ///< Full Blocks persisted after decode.
  /// Its storage reads (either side) and slot reservations that waited for
  /// room in a node's DRAM buffer.
  uint32_t buffer_waits = 0;
  /// Round trip of the control message that placed it: the prefill
  /// engine's fetch to the global scheduler and its reply, on the prefill
  /// engine's actor clock (wall ns in real time); -1 when the scheduler
  /// pushed the request to its group instead (no round trip).
  int64_t control_rtt_ns = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_result& x) {
  return f(caf::meta::type_name("request_result"), x.id, x.prefill, x.decode,
           x.ttft_ns, x.ttst_ns, x.tpot_ns, x.done_ns, x.bytes_read_pe,
           x.bytes_read_de, x.bytes_compute_net, x.blocks_verified,
           x.verify_failures, x.recomputed_blocks, x.reroutes, x.bytes_pe_to_de,
           x.bytes_de_to_pe, x.blocks_persisted, x.buffer_waits,
           x.control_rtt_ns);
}

/// An engine could not complete its attempt at a request: `id` is the id the
/// engine was given (the attempt in its top bits), `error` why it failed, as
/// the failing part reported it (transport, storage, gpu or CAF category).
struct request_failure {
  uint64_t id = 0;
  engine_id engine;
  caf::error error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_failure& x) {
  return f(caf::meta::type_name("request_failure"), x.id, x.engine, x.error);
}

// -- load reports -------------------------------------------------------------

/// What an engine reports to the scheduler: seq_e (unfinished requests),
/// tok_e (their total tokens), its node's storage read queue and free HBM.
struct engine_load {
  engine_id engine;
  uint32_t seq = 0;
  uint64_t tok = 0;
  uint64_t read_q_tokens = 0;
  uint64_t read_q_bytes = 0;
  uint64_t free_hbm_bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_load& x) {
  return f(caf::meta::type_name("engine_load"), x.engine, x.seq, x.tok,
           x.read_q_tokens, x.read_q_bytes, x.free_hbm_bytes);
}

/// A group leader's report: the loads of every engine of its group.
struct group_report {
  uint32_t group = 0;
  engine_role role = engine_role::prefill;
  std::vector<engine_load> engines;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_report& x) {
  return f(caf::meta::type_name("group_report"), x.group, x.role, x.engines);
}

/// An engine joining the scheduler: who it is, its group and its handle.
/// A decode engine also says how much KV its GPU can take (nothing is
/// committed at enrollment), so the scheduler can place requests on it from
/// the first fetch instead of waiting for its first report (until then it
/// would count as full, and the groups whose engines reported first would
/// get the whole first wave: measured, the other group's reads then waited
/// behind it at the prefill node, DS 27B 1P2D JCT +9%).
struct engine_registration {
  engine_id engine;
  uint32_t group = 0;
  caf::actor handle;
  uint64_t free_hbm_bytes = 0; ///< Decode: its KV budget. Prefill: 0.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_registration& x) {
  return f(caf::meta::type_name("engine_registration"), x.engine, x.group,
           x.handle, x.free_hbm_bytes);
}

// -- storage ------------------------------------------------------------------

/// Read the Full Blocks `blocks` (consecutive, from the prompt's start at
/// `first_block`) into the reader's DRAM buffer pool.
struct read_request {
  uint64_t request_id = 0;
  std::vector<block_hash> blocks;
  uint32_t first_block = 0;
  uint32_t tokens = 0; ///< Tokens the read covers (for read_q accounting).
  /// The actor that will release the read's leases, if it is not the
  /// reader's own process (a client in another process): the reader
  /// monitors it, and when it goes down (it exits, its process dies, the
  /// connection to its node breaks) frees every lease it still holds, and
  /// those of its reads still under way as they complete. Empty: nothing is
  /// tracked, the requester releases (the engines, which share the
  /// reader's process and fate).
  caf::actor holder{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, read_request& x) {
  return f(caf::meta::type_name("read_request"), x.request_id, x.blocks,
           x.first_block, x.tokens, x.holder);
}

/// A Full Block resident in a reader's buffer pool, until released. On a
/// modeled data plane one lease may stand for a run of `blocks` consecutive
/// blocks of the prompt (no bytes, an empty region; storage_reader_config::
/// lease_runs): every consumer counts a lease as `blocks` blocks from
/// `block_index`, and one release frees them all.
struct buffer_lease {
  uint64_t lease_id = 0;
  block_hash hash = 0;      ///< The (first) block's hash.
  uint32_t block_index = 0; ///< Position of the (first) block in the prompt.
  remote_region region;     ///< Where the Full Block's bytes are.
  uint32_t blocks = 1;      ///< Consecutive blocks covered (modeled runs).
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_lease& x) {
  return f(caf::meta::type_name("buffer_lease"), x.lease_id, x.hash,
           x.block_index, x.region, x.blocks);
}

/// Completion of a read_request: the blocks now in DRAM, and the blocks that
/// failed (missing, corrupt, I/O error): those become misses to recompute.
struct read_completion {
  uint64_t request_id = 0;
  std::vector<buffer_lease> leases;
  std::vector<block_hash> failed;
  /// The read (or reservation) waited for room in the node's DRAM buffer.
  bool waited_for_buffer = false;
  /// Why each block of `failed` failed, in the same order (the store's
  /// storage_errc: missing_block, layer_checksum, io_error, ...).
  std::vector<caf::error> why_failed;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, read_completion& x) {
  return f(caf::meta::type_name("read_completion"), x.request_id, x.leases,
           x.failed, x.waited_for_buffer, x.why_failed);
}

/// A node's storage read queue, in tokens and bytes, and queued requests.
struct read_queue_status {
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  uint32_t requests = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, read_queue_status& x) {
  return f(caf::meta::type_name("read_queue_status"), x.tokens, x.bytes,
           x.requests);
}

/// Persist one completed Full Block whose bytes are at `source` (a region of
/// the requesting node) to storage.
struct persist_request {
  block_hash hash = 0;
  block_hash parent = 0;
  uint32_t tokens = 0;
  remote_region source;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, persist_request& x) {
  return f(caf::meta::type_name("persist_request"), x.hash, x.parent, x.tokens,
           x.source);
}

/// Persist a chain of completed Full Blocks whose content is generated from
/// their hashes (no source bytes: what a modeled data plane persists), in
/// order: hashes[0]'s parent is `parent`, each later block's the one before.
/// One message for a request's blocks instead of one per block. The reply is
/// how many were written from the front (a failed write ends the batch: the
/// blocks after it would chain on a block not in the store).
struct persist_batch {
  std::vector<block_hash> hashes;
  block_hash parent = 0;
  uint32_t tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, persist_batch& x) {
  return f(caf::meta::type_name("persist_batch"), x.hashes, x.parent, x.tokens);
}

// -- prefill and decode engines
// ---------------------------------------------------------------

/// The decode node's place for one prompt's KV, answered to the prefill
/// engine's admit once the decode-side hit blocks are read: one region per
/// block of the prompt (a trailing partial block included), each holding a
/// Full Block payload ([layer][token in block][bpt], actors/engines/
/// kv_layout.hpp). Decode-side hit blocks are the reader's buffers the read
/// landed in; the others were reserved for the prefill engine to write.
/// `failed` lists decode-side hit blocks the read could not deliver (they
/// become misses). On a modeled data plane `blocks` is empty (no byte moves).
struct decode_slot {
  uint64_t request_id = 0;
  std::vector<remote_region> blocks;
  std::vector<block_hash> failed;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_slot& x) {
  return f(caf::meta::type_name("decode_slot"), x.request_id, x.blocks,
           x.failed);
}

/// Tokens [first_token, first_token + tokens) of one request in one layer:
/// written by the prefill engine into the decode node's buffer (layer_batch),
/// or to be written by the decode node into a prefill GPU's staging
/// (`destination`, push_batch).
struct layer_chunk {
  uint64_t request_id = 0;
  uint32_t first_token = 0;
  uint32_t tokens = 0;
  uint64_t bytes = 0;        ///< Real bytes moved for it (0: none moved).
  remote_region destination; ///< push_batch only: where the tokens go.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_chunk& x) {
  return f(caf::meta::type_name("layer_chunk"), x.request_id, x.first_token,
           x.tokens, x.bytes, x.destination);
}

/// One layer of several requests, between one prefill node and one decode
/// node. As `layer` (prefill -> decode): the chunks' KV of `layer` is in the
/// decode node's buffer, the sender's links done moving it at `done_ns`. As
/// `push` (prefill -> decode, replied with the same type): write the chunks'
/// tokens of `layer` from the decode node's buffer to their destinations
/// (the decode-side hits, and tokens computed by earlier chunks); the reply
/// lists what moved, done on the decode node's links at `done_ns`.
struct layer_batch {
  uint32_t layer = 0;
  /// Emulated ns since the start at which the sender's links finish moving
  /// the bytes (0 = no bytes moved).
  int64_t done_ns = 0;
  std::vector<layer_chunk> chunks;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_batch& x) {
  return f(caf::meta::type_name("layer_batch"), x.layer, x.done_ns, x.chunks);
}

/// One request's part of a prefill step on one GPU (prefill engine -> its
/// layer streamer): `tokens` new tokens from `first` on (the tokens before
/// `first` are cached: its hits and earlier chunks' KV), at byte `offset` of
/// the GPU's layer slot. Tokens [0, pe_side_tokens) are the PE-side hits in
/// the node's buffer; [pe_side_tokens, first) are pushed by the decode node.
/// The real plane only fills `hashes` (the prompt's block hashes, for the
/// new tokens' deterministic KV), `pe_leases` (the PE-side blocks' buffer
/// leases, held by the engine until the step's last layer is loaded) and
/// `slot` (the decode node's buffer slots).
struct step_chunk {
  uint64_t request_id = 0;
  caf::actor decode_actor;
  uint32_t first = 0;
  uint32_t tokens = 0;
  uint32_t pe_side_tokens = 0;
  bool send_hits = false; ///< Its first chunk: the PE-side hits go out too.
  uint64_t offset = 0;
  std::vector<block_hash> hashes;
  std::vector<buffer_lease> pe_leases;
  decode_slot slot;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_chunk& x) {
  return f(caf::meta::type_name("step_chunk"), x.request_id, x.decode_actor,
           x.first, x.tokens, x.pe_side_tokens, x.send_hits, x.offset, x.hashes,
           x.pe_leases, x.slot);
}

/// One GPU's batch of a prefill step and the real bytes of one layer slot.
struct step_lane {
  std::vector<step_chunk> chunks;
  uint64_t layer_bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_lane& x) {
  return f(caf::meta::type_name("step_lane"), x.chunks, x.layer_bytes);
}

/// A packed step of a prefill node's GPUs (lanes[g] is GPU g's batch): its
/// `layers` run together, at most `window` resident at once, each lasting
/// `layer_s` seconds of emulated time.
struct prefill_step {
  uint64_t id = 0;
  std::vector<step_lane> lanes;
  uint32_t layers = 0;
  uint32_t window = 1;
  double layer_s = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_step& x) {
  return f(caf::meta::type_name("prefill_step"), x.id, x.lanes, x.layers,
           x.window, x.layer_s);
}

/// A prefill engine's summary of a request before it sends the request's
/// first layer: the hit blocks it uses (read errors shrink them), how many
/// planned hits are recomputed, the storage bytes (nominal) read on the
/// prefill side, and how many blocks of the hits it reads itself (the rest
/// are the decode node's own).
struct prefill_summary {
  uint64_t request_id = 0;
  uint32_t hit_blocks = 0;
  uint32_t recomputed_blocks = 0;
  uint64_t bytes_read_pe = 0;
  uint32_t pe_side_blocks = 0;
  uint32_t buffer_waits = 0; ///< Its PE-side read waited for buffer room.
  /// The fetch round trip that placed it (request_result::control_rtt_ns).
  int64_t control_rtt_ns = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_summary& x) {
  return f(caf::meta::type_name("prefill_summary"), x.request_id, x.hit_blocks,
           x.recomputed_blocks, x.bytes_read_pe, x.pe_side_blocks,
           x.buffer_waits, x.control_rtt_ns);
}

/// Leases handed back to a storage reader at once (one message for all the
/// blocks of a finished read; unknown or already released ids are ignored).
struct lease_release {
  std::vector<uint64_t> lease_ids;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lease_release& x) {
  return f(caf::meta::type_name("lease_release"), x.lease_ids);
}

/// Reserve empty buffer slots for `blocks` Full Blocks of a request, the
/// block indices `block_indices` of its prompt (what the prefill engine will
/// write into the decode node's buffer). Served ahead of queued reads.
struct reserve_request {
  uint64_t request_id = 0;
  std::vector<uint32_t> block_indices;
  /// 0: waits for room as long as it takes. Else how long (ns of the
  /// reader's clock, from its arrival) the requester waits: a reservation
  /// not served by then is dropped without taking a slot and answered with
  /// caf::sec::request_timeout, so that a requester that gave up (its
  /// request timed out, across processes its reply would be lost) leaks
  /// nothing. 0: no limit; negative: refused (invalid_argument).
  int64_t timeout_ns = 0;
  /// As read_request::holder: when it goes down, the reservation is dropped
  /// if it still waits, and its slots are freed if it was served.
  caf::actor holder{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reserve_request& x) {
  return f(caf::meta::type_name("reserve_request"), x.request_id,
           x.block_indices, x.timeout_ns, x.holder);
}

// -- bulk transport endpoint
// ----------------------------------------------------

/// How to reach a node's bulk endpoint: the backend in use and its connection
/// details (host:port for tcp; serialized queue-pair info for verbs).
struct endpoint_info {
  std::string node;
  std::string backend;
  std::string address;
  std::vector<uint8_t> details;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, endpoint_info& x) {
  return f(caf::meta::type_name("endpoint_info"), x.node, x.backend, x.address,
           x.details);
}

/// One one-sided write of `destination.length` bytes from a local region
/// (starting at `local_offset`) to `destination`.
struct write_op {
  uint32_t local_region = 0;
  uint64_t local_offset = 0;
  remote_region destination;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, write_op& x) {
  return f(caf::meta::type_name("write_op"), x.local_region, x.local_offset,
           x.destination);
}

/// A batch of writes posted together, with a traffic class, a deadline and a
/// tag that the completion carries back.
struct write_batch {
  uint64_t tag = 0;
  transport::traffic_class tclass = transport::traffic_class::kv;
  int64_t deadline_ns = 0; ///< Relative to posting; 0 = the configured default.
  std::vector<write_op> ops;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, write_batch& x) {
  return f(caf::meta::type_name("write_batch"), x.tag, x.tclass, x.deadline_ns,
           x.ops);
}

/// Completion of a write_batch: bytes written, or the error of the first
/// failed operation (every operation of a failed batch is reported failed).
struct batch_completion {
  uint64_t tag = 0;
  uint64_t bytes = 0;
  uint32_t failed_ops = 0;
  /// None on success; else the bulk transport's own error (category
  /// transport_errc, its context naming the operation), as the backend
  /// reported it.
  caf::error error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, batch_completion& x) {
  return f(caf::meta::type_name("batch_completion"), x.tag, x.bytes,
           x.failed_ops, x.error);
}

// -- nodes and observation
// --------------------------------------------------------

/// A node joining the cluster: its name, roles, bulk endpoint and actor handles
/// (engines, storage readers) by name.
struct node_info {
  std::string name;
  std::vector<engine_id> engines;
  endpoint_info endpoint;
  std::vector<std::string> actor_names;
  std::vector<caf::actor> actors;
  /// Digest of the settings the node's actors were built from; the
  /// supervisor refuses a node whose digest differs from its own.
  std::string settings_digest;
  /// Those settings, one "key = value" line each, so that a refusal can
  /// name each key that differs.
  std::string settings;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_info& x) {
  return f(caf::meta::type_name("node_info"), x.name, x.engines, x.endpoint,
           x.actor_names, x.actors, x.settings_digest, x.settings);
}

/// The cluster as the supervisor sees it.
struct cluster_view {
  uint64_t epoch = 0; ///< Incremented on every join, leave and loss.
  std::vector<node_info> nodes;
  /// The cluster's emulated time origin (system clock, ns since the Unix
  /// epoch): every node maps it onto its own actor clock.
  int64_t origin_unix_ns = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_view& x) {
  return f(caf::meta::type_name("cluster_view"), x.epoch, x.nodes,
           x.origin_unix_ns);
}

/// One named sample in a snapshot (unit in the name: `_bytes`, `_tokens`, ...).
struct metric_sample {
  std::string name;
  double value = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metric_sample& x) {
  return f(caf::meta::type_name("metric_sample"), x.name, x.value);
}

/// A periodic state snapshot of one actor.
struct state_snapshot {
  std::string source;
  int64_t at_ns = 0;
  std::vector<metric_sample> samples;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_snapshot& x) {
  return f(caf::meta::type_name("state_snapshot"), x.source, x.at_ns,
           x.samples);
}

/// One event (reroute, error, failover, span begin/end, ...).
struct event_record {
  std::string source;
  std::string kind;
  uint64_t request_id = 0;
  int64_t at_ns = 0;
  std::string detail;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, event_record& x) {
  return f(caf::meta::type_name("event_record"), x.source, x.kind, x.request_id,
           x.at_ns, x.detail);
}

} // namespace dualpath::actors
