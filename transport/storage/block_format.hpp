// The on-disk format of one KV block ("Full Block"): a 4096-byte header region
// followed by the payload, `layers` Layer Blocks back to back (layer-major).
// Layer Block l holds `block_tokens x bytes_per_token_layer` bytes (token-major
// inside the layer) and starts at header_bytes + l * layer_bytes, so a single
// layer is one contiguous range read, and the payload (all Layer Blocks
// concatenated) is the Full Block with no conversion. The payload is padded
// with zeros to a multiple of 4096 so whole-file reads work with O_DIRECT.
//
// Header region: [u32 LE n][n bytes of msgpack][u64 LE xxh64 of those bytes],
// zero-padded. The msgpack array holds magic "DPKV", format version, model id,
// block hash, parent hash, token count, layers, bytes per token per layer and
// one xxh64 checksum per Layer Block (so a single layer read is verifiable).
//
// Thread safety: pure functions and value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "transport/types.hpp"

namespace dualpath::transport::storage {

/// Bytes before the payload; also the O_DIRECT alignment of every range.
constexpr uint64_t header_bytes = 4096;

/// The alignment of offsets, lengths and buffers for O_DIRECT.
constexpr uint64_t io_alignment = 4096;

/// The format version this build writes and reads.
constexpr uint32_t format_version = 1;

constexpr uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

/// The KV geometry of a model: how large a block and its layers are.
struct kv_geometry {
  uint32_t layers = 0;
  uint32_t block_tokens = 64;
  uint32_t bytes_per_token_layer = 0;

  /// Bytes of one Layer Block.
  uint64_t layer_bytes() const {
    return uint64_t{block_tokens} * bytes_per_token_layer;
  }

  /// Bytes of the Full Block payload (all Layer Blocks).
  uint64_t payload_bytes() const {
    return layer_bytes() * layers;
  }

  /// Bytes of a block file (header region + padded payload).
  uint64_t file_bytes() const {
    return header_bytes + align_up(payload_bytes(), io_alignment);
  }

  /// File offset of Layer Block `layer`.
  uint64_t layer_offset(uint32_t layer) const {
    return header_bytes + layer_bytes() * layer;
  }

  friend bool operator==(const kv_geometry& x, const kv_geometry& y) {
    return x.layers == y.layers && x.block_tokens == y.block_tokens
           && x.bytes_per_token_layer == y.bytes_per_token_layer;
  }
};

/// The decoded header of a block file.
struct block_header {
  uint32_t version = format_version;
  std::string model_id;
  block_hash hash = 0;
  block_hash parent = 0;
  uint32_t tokens = 0;
  uint32_t layers = 0;
  uint32_t bytes_per_token_layer = 0;
  std::vector<uint64_t> layer_checksums;
};

/// xxh64 of a Layer Block's bytes.
uint64_t layer_checksum(const std::byte* data, size_t len);

/// Writes the header region (exactly header_bytes bytes) for `hdr` to `dst`.
/// Fails with invalid_argument if the header does not fit.
caf::error encode_header(const block_header& hdr, std::byte* dst);

/// Decodes a header region of `len` bytes. Fails with truncated (too short),
/// header_checksum (length or checksum wrong), bad_header (malformed msgpack,
/// wrong magic) or unknown_version.
caf::expected<block_header> decode_header(const std::byte* src, size_t len);

/// Checks that `hdr` describes block `hash` of model `model_id` with geometry
/// `geo`: fails with wrong_model (model id or geometry differ) or bad_header
/// (hash, or checksum count, differ).
caf::error check_header(const block_header& hdr, const std::string& model_id,
                        const kv_geometry& geo, block_hash hash);

/// Checks Layer Block `layer` at `data` against the header's checksum:
/// layer_checksum on mismatch, invalid_argument for a bad layer index.
caf::error verify_layer(const block_header& hdr, const kv_geometry& geo,
                        uint32_t layer, const std::byte* data);

/// Builds a complete block file image in `file` (geo.file_bytes() bytes) whose
/// payload already holds the Layer Blocks: computes the layer checksums,
/// writes the header and zeroes the padding.
caf::error seal_block(const kv_geometry& geo, const std::string& model_id,
                      block_hash hash, block_hash parent, std::byte* file);

/// Builds a complete block file image in `file` with the deterministic KV
/// content of kv_content.hpp.
caf::error make_block(const kv_geometry& geo, const std::string& model_id,
                      block_hash hash, block_hash parent, std::byte* file);

} // namespace dualpath::transport::storage
