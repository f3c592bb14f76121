#include "actors/token_list.hpp"

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

  std::mutex mtx;                            // guards the two below
  uint32_t hash_block_tokens = 0;            // block size of `hashes`
  std::vector<transport::block_hash> hashes; // chain over ids, full blocks
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

std::vector<transport::block_hash>
token_list::block_hashes(uint32_t block_tokens) const {
  std::vector<transport::block_hash> out;
  if (block_tokens == 0 || size_ < block_tokens)
    return out;
  size_t full = size_ / block_tokens;
  auto& b = *buf_;
  std::lock_guard<std::mutex> guard{b.mtx};
  if (b.hash_block_tokens != block_tokens) {
    b.hashes.clear();
    b.hash_block_tokens = block_tokens;
  }
  // Extends the shared chain up to this view's last full block: ids below
  // size_ were written before the view existed and never change.
  auto parent = b.hashes.empty() ? transport::root_hash : b.hashes.back();
  for (size_t k = b.hashes.size(); k < full; ++k) {
    parent = transport::storage::chain_hash(parent, data_ + k * block_tokens,
                                            block_tokens);
    b.hashes.push_back(parent);
  }
  out.assign(b.hashes.begin(), b.hashes.begin() + full);
  return out;
}

void token_sequence::reserve(size_t n) {
  if (buf_ && buf_->capacity >= n)
    return;
  auto next = std::make_shared<detail::token_buffer>(n);
  if (buf_) {
    std::memcpy(next->ids.get(), buf_->ids.get(), size_ * sizeof(uint32_t));
    std::lock_guard<std::mutex> guard{buf_->mtx};
    next->hash_block_tokens = buf_->hash_block_tokens;
    next->hashes = buf_->hashes;
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
