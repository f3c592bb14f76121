#include "transport/storage/block_format.hpp"

#include <cstring>

#include <msgpack.hpp>
#include <xxhash.h>

#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::transport::storage {

namespace {

constexpr const char* magic = "DPKV";

// Fields of the msgpack array, in order.
constexpr uint32_t header_fields = 9;

// Framing around the msgpack body: u32 length before, u64 checksum after.
constexpr size_t frame_overhead = 4 + 8;

void put_le(std::byte* dst, uint64_t x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = static_cast<std::byte>((x >> (8 * i)) & 0xff);
}

uint64_t get_le(const std::byte* src, size_t n) {
  uint64_t x = 0;
  for (size_t i = 0; i < n; ++i)
    x |= uint64_t{std::to_integer<uint8_t>(src[i])} << (8 * i);
  return x;
}

} // namespace

uint64_t layer_checksum(const std::byte* data, size_t len) {
  return XXH64(data, len, 0);
}

caf::error encode_header(const block_header& hdr, std::byte* dst) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{buf};
  pk.pack_array(header_fields);
  pk.pack(std::string{magic});
  pk.pack(hdr.version);
  pk.pack(hdr.model_id);
  pk.pack(hdr.hash);
  pk.pack(hdr.parent);
  pk.pack(hdr.tokens);
  pk.pack(hdr.layers);
  pk.pack(hdr.bytes_per_token_layer);
  pk.pack(hdr.layer_checksums);
  if (buf.size() + frame_overhead > header_bytes)
    return caf::make_error(storage_errc::invalid_argument,
                           "block header of " + std::to_string(buf.size())
                               + " bytes exceeds the header region");
  std::memset(dst, 0, header_bytes);
  put_le(dst, buf.size(), 4);
  std::memcpy(dst + 4, buf.data(), buf.size());
  put_le(dst + 4 + buf.size(), XXH64(buf.data(), buf.size(), 0), 8);
  return caf::none;
}

caf::expected<block_header> decode_header(const std::byte* src, size_t len) {
  if (len < frame_overhead)
    return caf::make_error(storage_errc::truncated, "header region");
  auto n = get_le(src, 4);
  if (n != 0 && n + frame_overhead <= header_bytes && n + frame_overhead > len)
    return caf::make_error(storage_errc::truncated, "header region");
  if (n == 0 || n + frame_overhead > header_bytes)
    return caf::make_error(storage_errc::header_checksum,
                           "implausible header length " + std::to_string(n));
  auto body = reinterpret_cast<const char*>(src + 4);
  if (XXH64(body, n, 0) != get_le(src + 4 + n, 8))
    return caf::make_error(storage_errc::header_checksum, "header checksum");
  block_header hdr;
  try {
    // A container cannot hold more elements than the body has bytes: the
    // limits keep a hostile length (one that passes the checksum, which is
    // no MAC) from making the unpacker allocate gigabytes (found by
    // fuzz/block_header.cpp).
    auto items = static_cast<std::size_t>(n);
    auto handle = msgpack::unpack(
        body, n, nullptr, nullptr,
        msgpack::unpack_limit(items, items, items, items, items, 8));
    auto& obj = handle.get();
    if (obj.type != msgpack::type::ARRAY || obj.via.array.size < 2)
      return caf::make_error(storage_errc::bad_header, "not an array");
    auto* f = obj.via.array.ptr;
    if (f[0].as<std::string>() != magic)
      return caf::make_error(storage_errc::bad_header, "wrong magic");
    hdr.version = f[1].as<uint32_t>();
    if (hdr.version != format_version)
      return caf::make_error(storage_errc::unknown_version,
                             "format version " + std::to_string(hdr.version));
    if (obj.via.array.size != header_fields)
      return caf::make_error(storage_errc::bad_header, "field count");
    hdr.model_id = f[2].as<std::string>();
    hdr.hash = f[3].as<uint64_t>();
    hdr.parent = f[4].as<uint64_t>();
    hdr.tokens = f[5].as<uint32_t>();
    hdr.layers = f[6].as<uint32_t>();
    hdr.bytes_per_token_layer = f[7].as<uint32_t>();
    hdr.layer_checksums = f[8].as<std::vector<uint64_t>>();
  } catch (const std::exception& e) {
    return caf::make_error(storage_errc::bad_header, e.what());
  }
  return hdr;
}

caf::error check_header(const block_header& hdr, const std::string& model_id,
                        const kv_geometry& geo, block_hash hash) {
  if (hdr.model_id != model_id)
    return caf::make_error(storage_errc::wrong_model,
                           "block of model '" + hdr.model_id + "', store of '"
                               + model_id + "'");
  if (hdr.layers != geo.layers || hdr.tokens != geo.block_tokens
      || hdr.bytes_per_token_layer != geo.bytes_per_token_layer)
    return caf::make_error(storage_errc::wrong_model, "KV geometry differs");
  if (hdr.hash != hash)
    return caf::make_error(storage_errc::bad_header, "block hash differs");
  if (hdr.layer_checksums.size() != hdr.layers)
    return caf::make_error(storage_errc::bad_header, "layer checksum count");
  return caf::none;
}

caf::error verify_layer(const block_header& hdr, const kv_geometry& geo,
                        uint32_t layer, const std::byte* data) {
  if (layer >= hdr.layer_checksums.size())
    return caf::make_error(storage_errc::invalid_argument,
                           "layer " + std::to_string(layer));
  if (layer_checksum(data, geo.layer_bytes()) != hdr.layer_checksums[layer])
    return caf::make_error(storage_errc::layer_checksum,
                           "layer " + std::to_string(layer));
  return caf::none;
}

namespace {

block_header header_of(const kv_geometry& geo, const std::string& model_id,
                       block_hash hash, block_hash parent) {
  block_header hdr;
  hdr.model_id = model_id;
  hdr.hash = hash;
  hdr.parent = parent;
  hdr.tokens = geo.block_tokens;
  hdr.layers = geo.layers;
  hdr.bytes_per_token_layer = geo.bytes_per_token_layer;
  return hdr;
}

} // namespace

caf::error seal_block(const kv_geometry& geo, const std::string& model_id,
                      block_hash hash, block_hash parent, std::byte* file) {
  auto hdr = header_of(geo, model_id, hash, parent);
  for (uint32_t l = 0; l < geo.layers; ++l)
    hdr.layer_checksums.push_back(
        layer_checksum(file + geo.layer_offset(l), geo.layer_bytes()));
  auto end = header_bytes + geo.payload_bytes();
  std::memset(file + end, 0, geo.file_bytes() - end);
  return encode_header(hdr, file);
}

caf::error make_block(const kv_geometry& geo, const std::string& model_id,
                      block_hash hash, block_hash parent, std::byte* file) {
  for (uint32_t l = 0; l < geo.layers; ++l)
    kv_fill_layer(hash, l, geo.block_tokens, geo.bytes_per_token_layer,
                  file + geo.layer_offset(l));
  return seal_block(geo, model_id, hash, parent, file);
}

} // namespace dualpath::transport::storage
