// The scheduler's view of the cluster as plain values: the load every engine
// reported (seq_e, tok_e, free HBM), the storage read queue of every node, the
// decode groups with their pending queues, and the requests waiting for
// placement. The policies (pe_selection.hpp, de_selection.hpp,
// path_choice.hpp, policy.hpp) read and update this state; the scheduler actor
// owns one instance, feeds it the leaders' reports and turns the policies'
// decisions into messages. No actor, clock or I/O dependency, so the same code
// runs in unit tests, the benchmark and the simulation.
//
// Thread-safety: none; one owner (the scheduler actor) uses it at a time.
// Ownership: plain values, copyable; engines and nodes are named by dense
// indices (the caller maps its own engine identities to them).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <caf/expected.hpp>

namespace dualpath::scheduler {

/// One request as the policies see it. Tokens are prompt tokens; the hit
/// tokens are the leading hit_blocks Full Blocks found in storage (so
/// hit_tokens is a multiple of the block size and <= prompt_tokens).
struct request_info {
  uint64_t id = 0;
  uint32_t prompt_tokens = 0; ///< tokens(r) = len(r): the prompt length.
  uint32_t hit_tokens = 0;    ///< Prompt tokens whose KV is in storage.
  uint32_t hit_blocks = 0;    ///< Leading Full Blocks found in storage.
  uint32_t gen_tokens = 0;    ///< Tokens the decode engine will generate.
  uint32_t kv_bytes_per_token = 0;

  /// Tokens of one hit block (0 when nothing hits).
  uint32_t block_tokens() const {
    return hit_blocks == 0 ? 0 : hit_tokens / hit_blocks;
  }

  /// HBM a decode engine reserves for the request: the KV of the prompt and
  /// of every generated token.
  uint64_t decode_hbm_bytes() const {
    return (uint64_t{prompt_tokens} + gen_tokens) * kv_bytes_per_token;
  }
};

/// What one engine reports (through its group leader).
struct engine_state {
  uint32_t id = 0;     ///< Caller's identity of the engine (not interpreted).
  uint32_t group = 0;  ///< Engine group, dense per role: 0 .. groups-1.
  uint32_t node = 0;   ///< Node index: engines of a node share its read queue.
  uint32_t seq = 0;    ///< seq_e: unfinished requests.
  uint64_t tok = 0;    ///< tok_e: total tokens of the unfinished requests.
  uint64_t read_q = 0; ///< Read queue of the engine's node, in tokens.
  uint64_t free_hbm_bytes = 0; ///< HBM free for new KV (decode engines).
};

/// A node's storage read path: the queue the scheduler sees and its rate.
struct node_state {
  uint64_t read_q = 0;            ///< Tokens queued for storage reads.
  double read_tokens_per_s = 1.0; ///< Storage NIC rate in tokens/s (> 0).
};

/// A decode engine group: its engines, the node its engines share, the total
/// tokens routed to it (tok_e of its engines plus its pending requests) and
/// the requests routed to it that no engine of the group holds yet (FIFO).
struct decode_group {
  std::vector<uint32_t> members; ///< Indices into cluster_state::decode.
  uint32_t node = 0;
  uint64_t total_tokens = 0;
  std::deque<request_info> pending;
};

/// The whole view. Build it with make(), then keep it current with the
/// update_* calls (reports) and the policies (decisions).
class cluster_state {
public:
  /// Checks and indexes the tables. Fails with caf::sec::invalid_argument,
  /// its context describing the first problem, when: a node index is out of
  /// range, a node's read rate is not positive, decode group ids are not
  /// dense 0..G-1, or a decode group's engines sit on different nodes (the
  /// DE side of a read must be one node).
  static caf::expected<cluster_state> make(std::vector<engine_state> prefill,
                                           std::vector<engine_state> decode,
                                           std::vector<node_state> nodes);

  cluster_state() = default;

  /// Replaces a prefill engine's reported load (seq, tok, read_q of its node).
  void update_prefill(uint32_t index, uint32_t seq, uint64_t tok,
                      uint64_t node_read_q);

  /// Replaces a decode engine's reported load; keeps its group's total.
  void update_decode(uint32_t index, uint32_t seq, uint64_t tok,
                     uint64_t node_read_q, uint64_t free_hbm_bytes);

  std::vector<engine_state> prefill;
  std::vector<engine_state> decode;
  std::vector<node_state> nodes;
  std::vector<decode_group> decode_groups;
};

} // namespace dualpath::scheduler
