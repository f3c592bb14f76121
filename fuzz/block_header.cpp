// libFuzzer target: the block file header parser
// (transport/storage/block_format.hpp). Whatever the bytes, decode_header
// returns a header or a typed error; a header it accepts encodes again and
// decodes to the same values.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/storage/block_format.hpp"

using namespace dualpath::transport::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto src = reinterpret_cast<const std::byte*>(data);
  auto hdr = decode_header(src, size);
  if (!hdr)
    return 0;
  std::vector<std::byte> again(header_bytes);
  if (encode_header(*hdr, again.data()))
    return 0; // accepted but too large to write back: allowed
  auto back = decode_header(again.data(), again.size());
  if (!back || back->model_id != hdr->model_id || back->hash != hdr->hash
      || back->parent != hdr->parent || back->tokens != hdr->tokens
      || back->layers != hdr->layers
      || back->layer_checksums != hdr->layer_checksums)
    __builtin_trap();
  return 0;
}
