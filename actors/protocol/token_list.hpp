// A prompt's token ids, immutable and shared, and the append-only sequence
// whose prefixes they are.
//
// A request's prompt (tens of thousands of ids at agentic lengths) travels
// from the replay to the scheduler, a prefill engine and a decode engine, and
// each of them keeps it while the request runs; copies of a token_list share
// one buffer instead of copying it. An agent's turn t + 1 prompt starts with
// its turn t prompt, so the replay keeps one token_sequence per agent and each
// turn's prompt is a prefix view of it: a turn appends its ~600 new ids
// instead of rebuilding ~30 K (measured: rebuilding and hashing every prompt
// was ~20% of a 48P96D simulation, its allocations most of the rest of malloc).
//
// The block hashes of a prompt's full blocks (chain_hash from root_hash, the
// store's key) are computed once per buffer and shared by every view of it:
// the scheduler's lookup and both engines' admissions ask for them.
//
// Serialized (to another node, by to_string) a token_list is the plain list of
// ids, as a vector would be; a loaded list has a buffer of its own.
//
// Thread safety: a token_list's ids never change after construction, so any
// number of threads may read copies concurrently, block_hashes() included
// (the shared cache is locked). A token_sequence has one owner; it appends only
// beyond the prefixes it handed out, so views stay valid and unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>

#include "transport/types.hpp"

namespace dualpath::actors {

namespace detail {
struct token_buffer;
} // namespace detail

class token_list {
public:
  using value_type = uint32_t;
  using const_iterator = const uint32_t*;

  token_list() = default;

  /// Takes the ids (implicit: a vector is a token list).
  token_list(std::vector<uint32_t> ids); // NOLINT(google-explicit-constructor)

  token_list(std::initializer_list<uint32_t> ids)
      : token_list(std::vector<uint32_t>(ids)) {
  }

  token_list(const token_list&) = default;
  token_list& operator=(const token_list&) = default;

  /// A moved-from list is empty (its view goes with the buffer).
  token_list(token_list&& other) noexcept
      : buf_(std::move(other.buf_)), data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }

  token_list& operator=(token_list&& other) noexcept {
    if (this != &other) {
      buf_ = std::move(other.buf_);
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }

  size_t size() const {
    return size_;
  }

  bool empty() const {
    return size_ == 0;
  }

  const uint32_t* data() const {
    return data_;
  }

  const_iterator begin() const {
    return data_;
  }

  const_iterator end() const {
    return data_ + size_;
  }

  uint32_t operator[](size_t i) const {
    return data_[i];
  }

  /// A copy of the ids.
  std::vector<uint32_t> to_vector() const {
    return {begin(), end()};
  }

  /// The hashes of the full blocks of `block_tokens` ids (a trailing partial
  /// block has none), chained from root_hash; the same as
  /// storage::block_hashes(to_vector(), block_tokens). Computed once per
  /// shared buffer and block size. Empty when block_tokens == 0.
  std::vector<transport::block_hash> block_hashes(uint32_t block_tokens) const;

  /// block_hashes() without a copy: a read-only view that keeps what it
  /// points into alive (the shared buffer's cache, whose storage never moves,
  /// or for another block size than the cached one a list of its own).
  struct hash_span {
    std::shared_ptr<const transport::block_hash> keep;
    size_t size = 0;

    const transport::block_hash* data() const {
      return keep.get();
    }

    const transport::block_hash* begin() const {
      return keep.get();
    }

    const transport::block_hash* end() const {
      return keep.get() + size;
    }
  };

  hash_span block_hash_span(uint32_t block_tokens) const;

  /// Whether two lists share one buffer (copies of each other, or prefixes
  /// of one token_sequence).
  bool shares_with(const token_list& other) const {
    return buf_ != nullptr && buf_ == other.buf_;
  }

  friend bool operator==(const token_list& x, const token_list& y);

  friend bool operator!=(const token_list& x, const token_list& y) {
    return !(x == y);
  }

private:
  friend class token_sequence;

  token_list(std::shared_ptr<detail::token_buffer> buf, const uint32_t* data,
             size_t size)
      : buf_(std::move(buf)), data_(data), size_(size) {
  }

  std::shared_ptr<detail::token_buffer> buf_;
  const uint32_t* data_ = nullptr;
  size_t size_ = 0;
};

/// An append-only id sequence whose prefixes are token_lists sharing its
/// buffer (and its block-hash cache).
class token_sequence {
public:
  token_sequence() = default;

  /// Appends `n` ids. Growing past the capacity moves the sequence to a new
  /// buffer (ids and cached hashes copied); views handed out keep the old one.
  void append(const uint32_t* ids, size_t n);

  /// Makes room for `n` ids in all without another move.
  void reserve(size_t n);

  /// Room for `n` more ids past size(), to be filled by the caller through
  /// the returned pointer and then committed with commit(n).
  uint32_t* extend(size_t n);

  /// Makes `n` more ids part of the sequence. Precondition: they were made
  /// room for by extend() and written; more than the room is clamped to it
  /// (a view never reaches past the buffer).
  void commit(size_t n);

  size_t size() const {
    return size_;
  }

  /// The first `n` ids as a shared list. Precondition: n <= size().
  token_list prefix(size_t n) const;

private:
  std::shared_ptr<detail::token_buffer> buf_;
  size_t size_ = 0;
};

/// Saves the ids as a list; loads into a fresh buffer (never into one that
/// other copies share).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_list& x) {
  if constexpr (Inspector::writes_state) {
    std::vector<uint32_t> tmp;
    auto load = [&]() -> caf::error {
      x = token_list{std::move(tmp)};
      return caf::none;
    };
    return f(tmp, caf::meta::load_callback(load));
  } else {
    // Reading only: a copy of the ids (serializing is off the hot path).
    auto ids = x.to_vector();
    return f(ids);
  }
}

} // namespace dualpath::actors
