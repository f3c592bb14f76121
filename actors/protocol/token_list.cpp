#include "actors/protocol/token_list.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <mutex>

#include "transport/storage/kv_content.hpp"

namespace dualpath::actors {

namespace detail {

/// The ids of a token_list (and of every prefix of one token_sequence) and
/// their full blocks' hashes, computed on first use.
struct token_buffer {
  explicit token_buffer(size_t cap)
      : ids(cap > 0 ? new uint32_t[cap] : nullptr), capacity(cap) {
  }

  std::unique_ptr<uint32_t[]> ids; // [0, capacity); written once each
  size_t capacity;

  std::mutex mtx;                 // guards the two below
  uint32_t hash_block_tokens = 0; // block size of `hashes`
  // Chain over ids, full blocks; reserved for the whole capacity at first
  // use, so its storage never moves (block_hash_span points into it).
  std::vector<transport::block_hash> hashes;
};

} // namespace detail

namespace {

size_t grown(size_t need) {
  // An eighth more than needed: a turn appends ~2% of an agentic prompt, so
  // a move (one copy of the prompt's ids) comes every few turns.
  return need + need / 8;
}

} // namespace

token_list::token_list(std::vector<uint32_t> ids) {
  if (ids.empty())
    return;
  buf_ = std::make_shared<detail::token_buffer>(ids.size());
  std::memcpy(buf_->ids.get(), ids.data(), ids.size() * sizeof(uint32_t));
  data_ = buf_->ids.get();
  size_ = ids.size();
}

bool operator==(const token_list& x, const token_list& y) {
  if (x.size_ != y.size_)
    return false;
  return x.data_ == y.data_ || std::equal(x.begin(), x.end(), y.begin());
}

token_list::hash_span token_list::block_hash_span(uint32_t block_tokens) const {
  hash_span out;
  if (block_tokens == 0 || size_ < block_tokens)
    return out;
  size_t full = size_ / block_tokens;
  auto& b = *buf_;
  std::lock_guard<std::mutex> guard{b.mtx};
  if (b.hash_block_tokens == 0) {
    // Room for every full block the buffer can hold: the cache never moves,
    // so views into it stay valid while the buffer lives.
    b.hash_block_tokens = block_tokens;
    b.hashes.reserve(b.capacity / block_tokens);
  }
  if (b.hash_block_tokens != block_tokens) {
    // Another block size than the cached one (tests, tools): not cached.
    auto own = std::make_shared<std::vector<transport::block_hash>>();
    own->reserve(full);
    auto parent = transport::root_hash;
    for (size_t k = 0; k < full; ++k) {
      parent = transport::storage::chain_hash(parent, data_ + k * block_tokens,
                                              block_tokens);
      own->push_back(parent);
    }
    out.keep = std::shared_ptr<const transport::block_hash>(own, own->data());
    out.size = full;
    return out;
  }
  // Extends the shared chain up to this view's last full block: ids below
  // size_ were written before the view existed and never change.
  auto parent = b.hashes.empty() ? transport::root_hash : b.hashes.back();
  for (size_t k = b.hashes.size(); k < full; ++k) {
    parent = transport::storage::chain_hash(parent, data_ + k * block_tokens,
                                            block_tokens);
    b.hashes.push_back(parent);
  }
  out.keep =
      std::shared_ptr<const transport::block_hash>(buf_, b.hashes.data());
  out.size = full;
  return out;
}

std::vector<transport::block_hash>
token_list::block_hashes(uint32_t block_tokens) const {
  auto span = block_hash_span(block_tokens);
  return {span.begin(), span.end()};
}

void token_sequence::reserve(size_t n) {
  if (buf_ && buf_->capacity >= n)
    return;
  auto next = std::make_shared<detail::token_buffer>(n);
  if (buf_) {
    std::memcpy(next->ids.get(), buf_->ids.get(), size_ * sizeof(uint32_t));
    std::lock_guard<std::mutex> guard{buf_->mtx};
    next->hash_block_tokens = buf_->hash_block_tokens;
    if (next->hash_block_tokens > 0) {
      next->hashes.reserve(n / next->hash_block_tokens); // never moves
      next->hashes.assign(buf_->hashes.begin(), buf_->hashes.end());
    }
  }
  buf_ = std::move(next);
}

uint32_t* token_sequence::extend(size_t n) {
  size_t cap = buf_ ? buf_->capacity : 0;
  if (size_ + n > cap)
    reserve(grown(size_ + n));
  return buf_ ? buf_->ids.get() + size_ : nullptr;
}

void token_sequence::commit(size_t n) {
  size_t cap = buf_ ? buf_->capacity : 0;
  assert(size_ + n <= cap);
  size_ = std::min(size_ + n, cap);
}

void token_sequence::append(const uint32_t* ids, size_t n) {
  if (n == 0)
    return;
  std::memcpy(extend(n), ids, n * sizeof(uint32_t));
  commit(n);
}

token_list token_sequence::prefix(size_t n) const {
  n = std::min(n, size_);
  if (n == 0)
    return {};
  return token_list{buf_, buf_->ids.get(), n};
}

} // namespace dualpath::actors
