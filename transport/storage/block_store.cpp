#include "transport/storage/block_store.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

namespace dualpath::transport::storage {

namespace {

// Looks up hashes[0..n) in order, calling f(k, hash, parent or nullptr) until
// it returns false. The probes are independent, so each prefetches the slot
// of the hash 8 ahead: their cache misses overlap (a prompt is ~1,000 blocks
// in a table of tens of millions).
template <class F>
void probe(const block_index& index, const block_hash* hashes, size_t n, F f) {
  constexpr size_t ahead = 8;
  for (size_t k = 0; k < std::min(ahead, n); ++k)
    index.prefetch(hashes[k]);
  for (size_t k = 0; k < n; ++k) {
    if (k + ahead < n)
      index.prefetch(hashes[k + ahead]);
    if (!f(k, hashes[k], index.find(hashes[k])))
      return;
  }
}

std::string hex16(block_hash h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return buf;
}

bool parse_hex16(const std::string& s, block_hash& out) {
  if (s.size() != 16)
    return false;
  out = 0;
  for (char c : s) {
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else
      return false;
    out = (out << 4) | static_cast<uint64_t>(v);
  }
  return true;
}

constexpr const char* suffix = ".kv";

} // namespace

block_store::block_store(store_config cfg, backend_ptr backend)
    : cfg_(std::move(cfg)), backend_(std::move(backend)) {
  // nop
}

caf::expected<std::unique_ptr<block_store>>
block_store::open(store_config cfg, backend_ptr backend) {
  if (cfg.geometry.layers == 0 || cfg.geometry.block_tokens == 0
      || cfg.geometry.bytes_per_token_layer == 0)
    return caf::make_error(storage_errc::invalid_argument,
                           "KV geometry has a zero dimension");
  if (cfg.directory.empty())
    return caf::make_error(storage_errc::invalid_argument, "no directory");
  if (auto err = backend->make_dir(cfg.directory))
    return caf::make_error(storage_errc::unreadable_directory,
                           caf::to_string(err));
  std::unique_ptr<block_store> store{
      new block_store(std::move(cfg), std::move(backend))};
  if (auto err = store->rebuild())
    return err;
  return store;
}

std::string block_store::path_of(block_hash hash) const {
  auto hex = hex16(hash);
  return cfg_.directory + "/" + hex.substr(0, 2) + "/" + hex + suffix;
}

caf::error block_store::rebuild() {
  auto subdirs = backend_->list(cfg_.directory);
  if (!subdirs)
    return std::move(subdirs.error());
  // Collect candidate files, then read all their header regions in one batch
  // (queue-depth deep) instead of one at a time.
  std::vector<std::pair<block_hash, std::string>> files;
  for (auto& sub : *subdirs) {
    if (sub.size() != 2)
      continue;
    auto names = backend_->list(cfg_.directory + "/" + sub);
    if (!names)
      return std::move(names.error());
    for (auto& name : *names) {
      block_hash h;
      auto stem_len = name.size() - std::strlen(suffix);
      if (name.size() <= std::strlen(suffix)
          || name.compare(stem_len, std::string::npos, suffix) != 0
          || !parse_hex16(name.substr(0, stem_len), h)
          || name.compare(0, 2, sub) != 0) {
        // Temporary files of interrupted writes and foreign files.
        continue;
      }
      files.emplace_back(h, cfg_.directory + "/" + sub + "/" + name);
    }
  }
  constexpr size_t batch = 256;
  auto buf = aligned_buffer::make(header_bytes * batch);
  if (!buf)
    return std::move(buf.error());
  for (size_t first = 0; first < files.size(); first += batch) {
    auto n = std::min(batch, files.size() - first);
    std::vector<read_op> ops;
    for (size_t i = 0; i < n; ++i)
      ops.push_back(read_op{files[first + i].second, 0,
                            buf->data() + i * header_bytes, header_bytes});
    auto res = backend_->read(ops, cfg_.mode);
    for (size_t i = 0; i < n; ++i) {
      auto hash = files[first + i].first;
      if (!res[i]) {
        ++scan_.rejected;
        continue;
      }
      auto hdr = decode_header(ops[i].buffer, *res[i]);
      if (!hdr || check_header(*hdr, cfg_.model_id, cfg_.geometry, hash)) {
        ++scan_.rejected;
        continue;
      }
      insert(hash, hdr->parent);
      ++scan_.blocks;
    }
  }
  return caf::none;
}

void block_store::insert(block_hash hash, block_hash parent) {
  std::unique_lock<std::shared_mutex> guard{mtx_};
  parent_of_.insert(hash, parent);
}

lookup_result block_store::lookup(const std::vector<uint32_t>& tokens) const {
  auto hashes = block_hashes(tokens, cfg_.geometry.block_tokens);
  return lookup(hashes.data(), hashes.size());
}

size_t block_store::hit_run(const block_hash* hashes, size_t n,
                            block_hash parent) const {
  size_t hits = 0;
  std::shared_lock<std::shared_mutex> guard{mtx_};
  probe(parent_of_, hashes, n, [&](size_t, block_hash h, const block_hash* p) {
    // The parent check makes a (practically impossible) hash collision
    // with another prefix end the hit instead of splicing two prompts.
    if (p == nullptr || *p != parent)
      return false;
    ++hits;
    parent = h;
    return true;
  });
  return hits;
}

lookup_result block_store::lookup(const block_hash* hashes, size_t n) const {
  lookup_result result;
  auto hits = hit_run(hashes, n);
  result.blocks.assign(hashes, hashes + hits);
  result.hit_tokens = uint64_t{cfg_.geometry.block_tokens} * hits;
  return result;
}

void block_store::contains(const block_hash* hashes, size_t n,
                           uint8_t* present) const {
  std::shared_lock<std::shared_mutex> guard{mtx_};
  probe(parent_of_, hashes, n,
        [present](size_t k, block_hash, const block_hash* p) {
          present[k] = p != nullptr ? 1 : 0;
          return true;
        });
}

bool block_store::contains(block_hash hash) const {
  std::shared_lock<std::shared_mutex> guard{mtx_};
  return parent_of_.contains(hash);
}

void block_store::reserve(size_t blocks) {
  std::unique_lock<std::shared_mutex> guard{mtx_};
  try {
    parent_of_.reserve(blocks);
  } catch (const std::bad_alloc&) {
    // A hint: the index grows as needed instead (and may fail then).
  }
}

size_t block_store::size() const {
  std::shared_lock<std::shared_mutex> guard{mtx_};
  return parent_of_.size();
}

bool block_store::keeps_payload() const {
  return backend_->keeps_payload();
}

std::optional<block_hash> block_store::parent_of(block_hash hash) const {
  std::shared_lock<std::shared_mutex> guard{mtx_};
  auto* p = parent_of_.find(hash);
  if (p == nullptr)
    return std::nullopt;
  return *p;
}

caf::error block_store::write(block_hash hash, block_hash parent,
                              const std::byte* file) {
  if (!keeps_payload()) {
    insert(hash, parent); // the content is regenerated on read
    return caf::none;
  }
  auto path = path_of(hash);
  if (auto err = backend_->make_dir(path.substr(0, path.rfind('/'))))
    return err;
  if (auto err = backend_->write_atomic(path, file, cfg_.geometry.file_bytes(),
                                        cfg_.sync))
    return err;
  insert(hash, parent);
  return caf::none;
}

caf::error block_store::write_generated(block_hash hash, block_hash parent) {
  if (!keeps_payload()) {
    insert(hash, parent);
    return caf::none;
  }
  auto buf = aligned_buffer::make(cfg_.geometry.file_bytes());
  if (!buf)
    return std::move(buf.error());
  if (auto err =
          make_block(cfg_.geometry, cfg_.model_id, hash, parent, buf->data()))
    return err;
  return write(hash, parent, buf->data());
}

caf::error block_store::verify_file(block_hash hash, const std::byte* file,
                                    size_t got, block_header* out) {
  auto hdr = decode_header(file, std::min<size_t>(got, header_bytes));
  if (!hdr)
    return std::move(hdr.error());
  if (auto err = check_header(*hdr, cfg_.model_id, cfg_.geometry, hash))
    return err;
  auto& geo = cfg_.geometry;
  if (got < header_bytes + geo.payload_bytes())
    return caf::make_error(
        storage_errc::truncated,
        path_of(hash) + ": " + std::to_string(got) + " of "
            + std::to_string(header_bytes + geo.payload_bytes()) + " bytes");
  for (uint32_t l = 0; l < geo.layers; ++l)
    if (auto err = verify_layer(*hdr, geo, l, file + geo.layer_offset(l)))
      return caf::make_error(storage_errc::layer_checksum,
                             path_of(hash) + ": " + caf::to_string(err));
  if (out)
    *out = std::move(*hdr);
  return caf::none;
}

caf::expected<block_header> block_store::read_full(block_hash hash,
                                                   std::byte* file) {
  auto errs = read_full_batch({hash}, {file});
  if (errs[0])
    return std::move(errs[0]);
  // Decoding twice is cheap (a few hundred bytes) and keeps the batch API
  // free of per-block headers.
  auto decoded = decode_header(file, header_bytes);
  if (!decoded)
    return std::move(decoded.error());
  return std::move(*decoded);
}

std::vector<caf::error>
block_store::read_full_batch(const std::vector<block_hash>& hashes,
                             const std::vector<std::byte*>& files) {
  std::vector<caf::error> errs(hashes.size());
  if (files.size() != hashes.size()) {
    for (auto& e : errs)
      e = caf::make_error(storage_errc::invalid_argument, "buffer count");
    return errs;
  }
  if (!keeps_payload()) {
    // Only the index holds these blocks: rebuild each file image.
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto parent = parent_of(hashes[i]);
      if (!parent)
        errs[i] = caf::make_error(storage_errc::missing_block,
                                  path_of(hashes[i]) + ": not stored");
      else
        errs[i] = make_block(cfg_.geometry, cfg_.model_id, hashes[i], *parent,
                             files[i]);
    }
    return errs;
  }
  std::vector<read_op> ops;
  ops.reserve(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i)
    ops.push_back(
        read_op{path_of(hashes[i]), 0, files[i], cfg_.geometry.file_bytes()});
  auto res = backend_->read(ops, cfg_.mode);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!res[i])
      errs[i] = std::move(res[i].error());
    else
      errs[i] = verify_file(hashes[i], files[i], *res[i], nullptr);
  }
  return errs;
}

caf::error block_store::read_layer(block_hash hash, uint32_t layer,
                                   std::byte* dst) {
  auto& geo = cfg_.geometry;
  if (layer >= geo.layers)
    return caf::make_error(storage_errc::invalid_argument,
                           "layer " + std::to_string(layer));
  auto path = path_of(hash);
  if (!keeps_payload()) {
    if (!contains(hash))
      return caf::make_error(storage_errc::missing_block,
                             path + ": not stored");
    kv_fill_layer(hash, layer, geo.block_tokens, geo.bytes_per_token_layer,
                  dst);
    return caf::none;
  }
  // The range read covers the aligned span around the layer so it also works
  // with O_DIRECT (Layer Blocks need not be 4 KiB multiples).
  auto begin = geo.layer_offset(layer) / io_alignment * io_alignment;
  auto end =
      align_up(geo.layer_offset(layer) + geo.layer_bytes(), io_alignment);
  auto hdr_buf = aligned_buffer::make(header_bytes);
  if (!hdr_buf)
    return std::move(hdr_buf.error());
  auto span = aligned_buffer::make(end - begin);
  if (!span)
    return std::move(span.error());
  std::vector<read_op> ops{
      read_op{path, 0, hdr_buf->data(), header_bytes},
      read_op{path, begin, span->data(), static_cast<size_t>(end - begin)}};
  auto res = backend_->read(ops, cfg_.mode);
  if (!res[0])
    return std::move(res[0].error());
  if (!res[1])
    return std::move(res[1].error());
  auto hdr = decode_header(hdr_buf->data(), *res[0]);
  if (!hdr)
    return std::move(hdr.error());
  if (auto err = check_header(*hdr, cfg_.model_id, geo, hash))
    return err;
  auto skip = geo.layer_offset(layer) - begin;
  if (*res[1] < skip + geo.layer_bytes())
    return caf::make_error(storage_errc::truncated,
                           path + ": layer " + std::to_string(layer));
  auto* src = span->data() + skip;
  if (auto err = verify_layer(*hdr, geo, layer, src))
    return err;
  std::memcpy(dst, src, geo.layer_bytes());
  return caf::none;
}

caf::expected<populate_stats>
populate(block_store& store, const std::vector<std::vector<uint32_t>>& seqs) {
  populate_stats stats;
  auto& geo = store.geometry();
  auto buf = aligned_buffer::make(geo.file_bytes());
  if (!buf)
    return std::move(buf.error());
  for (auto& seq : seqs) {
    auto parent = root_hash;
    for (auto h : block_hashes(seq, geo.block_tokens)) {
      if (store.contains(h)) {
        ++stats.present;
      } else {
        if (!store.keeps_payload()) {
          if (auto err = store.write_generated(h, parent))
            return err;
        } else {
          if (auto err = make_block(geo, store.config().model_id, h, parent,
                                    buf->data()))
            return err;
          if (auto err = store.write(h, parent, buf->data()))
            return err;
        }
        ++stats.written;
        stats.bytes += geo.file_bytes();
      }
      parent = h;
    }
  }
  return stats;
}

} // namespace dualpath::transport::storage
