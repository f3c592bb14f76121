// block_store: KV blocks of one model in one directory, one file per block
// (dir/<first two hex digits>/<16 hex digits>.kv, see block_format.hpp), with
// an in-memory prefix index. A block's hash chains its parent's hash and its
// token ids (kv_content.hpp), so the index is a trie of prompt prefixes:
// lookup(tokens) returns the longest run of consecutive stored blocks from the
// prompt's start. The index is rebuilt at open() by reading every header.
//
// Every read is verified: the header (checksum, magic, version, model id,
// geometry, hash) and the checksum of every Layer Block read; a failed check
// is a typed storage_errc and no unverified byte is reported as valid.
//
// Thread safety: all member functions are thread-safe (the index is guarded
// by a shared mutex; file I/O goes through the thread-safe backend).
// Concurrent writers of the same block are safe: files are replaced by an
// atomic rename and index insertion is idempotent.
// Ownership: shares the backend; buffers passed in stay owned by callers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "transport/storage/backend.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/block_index.hpp"

namespace dualpath::transport::storage {

struct store_config {
  std::string directory;
  std::string model_id;
  kv_geometry geometry;
  io_mode mode = io_mode::buffered;   ///< Reads with O_DIRECT or buffered.
  durability sync = durability::none; ///< fsync each written block.
};

/// The result of a prefix lookup.
struct lookup_result {
  std::vector<block_hash> blocks; ///< Hit blocks, in prompt order.
  uint64_t hit_tokens = 0;        ///< blocks.size() * block_tokens.
};

/// What open() found while rebuilding the index.
struct scan_stats {
  uint64_t blocks = 0;   ///< Valid blocks indexed.
  uint64_t rejected = 0; ///< Files skipped (bad header, other model, ...).
};

/// What populate() did.
struct populate_stats {
  uint64_t written = 0; ///< Blocks written.
  uint64_t present = 0; ///< Blocks already stored.
  uint64_t bytes = 0;   ///< Bytes written.
};

class block_store {
public:
  /// Opens (creating if absent) the store at cfg.directory and rebuilds the
  /// index from the headers of the files found. Fails with
  /// unreadable_directory if the directory cannot be listed; single bad files
  /// are skipped and counted in scan().
  static caf::expected<std::unique_ptr<block_store>> open(store_config cfg,
                                                          backend_ptr backend);

  const store_config& config() const {
    return cfg_;
  }

  const kv_geometry& geometry() const {
    return cfg_.geometry;
  }

  storage_backend& backend() const {
    return *backend_;
  }

  const scan_stats& scan() const {
    return scan_;
  }

  // -- index ------------------------------------------------------------------

  /// The longest run of stored consecutive full blocks of `tokens` from the
  /// start.
  lookup_result lookup(const std::vector<uint32_t>& tokens) const;

  /// lookup() of a prompt whose full blocks' hashes (block_hashes() of its
  /// ids with geometry().block_tokens) are hashes[0, n).
  lookup_result lookup(const block_hash* hashes, size_t n) const;

  /// How many of hashes[0, n) are stored one after another from the first,
  /// each with the one before as its parent (`parent` for hashes[0]): the
  /// hit length of lookup() without building the list, and a way to probe
  /// only past a prefix the caller already found stored (entries are never
  /// removed, so a stored prefix stays stored).
  size_t hit_run(const block_hash* hashes, size_t n,
                 block_hash parent = root_hash) const;

  bool contains(block_hash hash) const;

  /// contains() for `n` blocks at once (present[k] = 1 or 0), their cache
  /// misses overlapped: a reader checks a request's blocks this way.
  void contains(const block_hash* hashes, size_t n, uint8_t* present) const;

  /// Makes room in the index for `blocks` blocks in all (a hint: more still
  /// fit, with a rehash).
  void reserve(size_t blocks);

  /// Number of indexed blocks.
  size_t size() const;

  /// The file of block `hash` (whether or not it exists).
  std::string path_of(block_hash hash) const;

  // -- writes -----------------------------------------------------------------

  /// Writes a complete block file image (geometry().file_bytes() bytes, made
  /// by seal_block or make_block) atomically and indexes it.
  caf::error write(block_hash hash, block_hash parent, const std::byte* file);

  /// Writes block `hash` with the deterministic KV content.
  caf::error write_generated(block_hash hash, block_hash parent);

  /// Whether the backend keeps block payloads. When it does not (the
  /// modeled backend of `dualpath sim`), blocks live in the index only:
  /// writes just index them and reads regenerate the deterministic content
  /// (kv_content.hpp) -- nothing per block beyond the index entry.
  bool keeps_payload() const;

  /// The parent of stored block `hash`, if it is stored.
  std::optional<block_hash> parent_of(block_hash hash) const;

  // -- reads ------------------------------------------------------------------

  /// Reads the whole file of block `hash` into `file` (geometry().file_bytes()
  /// bytes, io_alignment-aligned for O_DIRECT) and verifies header and every
  /// layer. The payload (the Full Block) starts at file + header_bytes.
  caf::expected<block_header> read_full(block_hash hash, std::byte* file);

  /// read_full for many blocks with the backend's queue depth; one error
  /// (none on success) per block.
  std::vector<caf::error> read_full_batch(const std::vector<block_hash>& hashes,
                                          const std::vector<std::byte*>& files);

  /// Reads Layer Block `layer` of block `hash` (one range read plus the
  /// header) into `dst` (geometry().layer_bytes() bytes) and verifies it.
  caf::error read_layer(block_hash hash, uint32_t layer, std::byte* dst);

private:
  block_store(store_config cfg, backend_ptr backend);

  caf::error rebuild();
  void insert(block_hash hash, block_hash parent);
  caf::error verify_file(block_hash hash, const std::byte* file, size_t got,
                         block_header* out);

  store_config cfg_;
  backend_ptr backend_;
  scan_stats scan_;
  mutable std::shared_mutex mtx_;
  block_index parent_of_; // the trie's edges
};

/// Writes every full block of every sequence that is not stored yet, with the
/// deterministic KV content, so a store is ready for a trace.
caf::expected<populate_stats>
populate(block_store& store, const std::vector<std::vector<uint32_t>>& seqs);

} // namespace dualpath::transport::storage
