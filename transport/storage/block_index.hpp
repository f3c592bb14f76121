// The block store's index: block hash -> parent hash, the edges of the prefix
// trie. A store holds every block of every agent's history (tens of millions
// at 48P96D), and each request looks up its whole prompt, so the index is an
// open-addressing table (linear probing, one 16-byte slot per entry, at most
// 3/4 full): one cache line per lookup instead of a bucket and a node, and no
// allocation per entry. Entries are never removed (the store only grows).
//
// A table of 4 MiB or more lives in its own anonymous mapping advised for
// transparent huge pages (2 MiB pages where the kernel allows, madvise
// mode): at 58 M entries the table is 2 GiB and every probe a cache miss;
// with 4 KiB pages each also missed the TLB (docs/simulation.md, Speed).
// A fresh mapping is zero-filled, i.e. all slots empty, without a pass.
//
// Thread safety: none; the block store guards it with its lock.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dualpath::transport::storage {

class block_index {
public:
  /// Inserts `key` -> `parent` unless `key` is present (then keeps the
  /// stored parent). Returns whether it inserted.
  bool insert(uint64_t key, uint64_t parent);

  /// Makes room for `n` entries in all, so that inserting up to that many
  /// never rehashes (a rehash moves every entry: at 50 M entries, 1.5 GB).
  void reserve(size_t n);

  /// The parent stored for `key`, or nullptr. Valid until the next insert.
  const uint64_t* find(uint64_t key) const;

  bool contains(uint64_t key) const {
    return find(key) != nullptr;
  }

  /// Hints that `key` will be looked up soon: lookups of many keys (a
  /// prompt's blocks) overlap their cache misses when each prefetches a few
  /// keys ahead.
  void prefetch(uint64_t key) const {
    if (!slots_.empty())
      __builtin_prefetch(&slots_[home(key)]);
  }

  size_t size() const {
    return size_;
  }

  /// Bytes the table takes (slots only).
  size_t memory_bytes() const {
    return slots_.size() * sizeof(slot);
  }

private:
  // key 0 marks an empty slot; a real key 0 lives in zero_ (hashes are
  // 64-bit digests, but nothing here relies on that).
  struct slot {
    uint64_t key = 0;
    uint64_t parent = 0;
  };

  // The slot array: zeroed memory owned by this object (RAII), from calloc
  // or, when large, an anonymous mapping advised for huge pages.
  class slot_table {
  public:
    slot_table() = default;
    explicit slot_table(size_t n); // throws std::bad_alloc
    slot_table(slot_table&& other) noexcept;
    slot_table& operator=(slot_table&& other) noexcept;
    slot_table(const slot_table&) = delete;
    slot_table& operator=(const slot_table&) = delete;
    ~slot_table();

    size_t size() const {
      return n_;
    }

    bool empty() const {
      return n_ == 0;
    }

    slot& operator[](size_t i) {
      return data_[i];
    }

    const slot& operator[](size_t i) const {
      return data_[i];
    }

    slot* begin() {
      return data_;
    }

    slot* end() {
      return data_ + n_;
    }

  private:
    void release() noexcept;

    slot* data_ = nullptr;
    size_t n_ = 0;
    void* map_ = nullptr; // the mapping, when mapped (else data_ is calloc's)
    size_t map_bytes_ = 0;
  };

  size_t home(uint64_t key) const;
  void grow();
  void rehash(size_t slots); // slots: a power of two

  slot_table slots_;
  size_t size_ = 0; // entries, zero_ included
  unsigned shift_ = 64;
  bool has_zero_ = false;
  uint64_t zero_parent_ = 0;
};

} // namespace dualpath::transport::storage
