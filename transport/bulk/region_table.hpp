// The table of registered regions, shared by the local and tcp backends: on
// the receiver side, lookup checks region id, key and bounds and pins the
// region while a write lands in it; on the sender side, a posted batch holds
// its source regions (hold) until it completes. Deregistration removes the
// entry and waits until every pin is released, so no write lands in memory
// the owner freed and no send reads it.
//
// Thread safety: all members are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <caf/expected.hpp>

#include "transport/bulk/backend.hpp"

namespace dualpath::transport::bulk {

class region_table {
public:
  struct entry {
    uint8_t* ptr = nullptr;
    uint64_t len = 0;
    uint64_t key = 0;
  };

  /// A pinned region; unpins on destruction (move-only).
  class pin {
  public:
    pin() = default;
    pin(region_table* owner, uint32_t id, entry e)
        : owner_(owner), id_(id), entry_(e) {
      // nop
    }
    pin(pin&& other) noexcept
        : owner_(other.owner_), id_(other.id_), entry_(other.entry_) {
      other.owner_ = nullptr;
    }
    pin& operator=(pin&& other) noexcept {
      if (this != &other) {
        reset();
        owner_ = other.owner_;
        id_ = other.id_;
        entry_ = other.entry_;
        other.owner_ = nullptr;
      }
      return *this;
    }
    ~pin() {
      reset();
    }
    void reset() {
      if (owner_) {
        owner_->unpin(id_);
        owner_ = nullptr;
      }
    }
    explicit operator bool() const {
      return owner_ != nullptr;
    }
    uint8_t* ptr() const {
      return entry_.ptr;
    }
    uint32_t id() const {
      return id_;
    }

  private:
    region_table* owner_ = nullptr;
    uint32_t id_ = 0;
    entry entry_;
  };

  /// Adds a region with a fresh id and random key; returns its descriptor.
  remote_region add(const std::string& node, void* ptr, uint64_t len);

  /// Pins local region `id` as the source of a posted batch: no key and no
  /// bounds (backend::validate checked the ranges), but `base` must be the
  /// region's start, so a registration of another backend (whose ids
  /// overlap ours) is refused. Errors: unknown_region (absent, being
  /// removed, or not this table's).
  transport_errc hold(uint32_t id, const void* base, pin& out);

  /// Removes `id`: from now on it cannot be pinned; blocks until no pin on
  /// it remains. `while_pinned` runs once (without the table's lock) when
  /// pins remain, to make their holders let go sooner.
  void remove(uint32_t id, const std::function<void()>& while_pinned = {});

  /// Checks id, key and [offset, offset+len) and pins the region; the pin's
  /// ptr() points at byte `offset`. Errors: unknown_region, wrong_key,
  /// out_of_bounds.
  transport_errc acquire(uint32_t id, uint64_t key, uint64_t offset,
                         uint64_t len, pin& out);

private:
  void unpin(uint32_t id);

  struct slot {
    entry e;
    uint32_t pins = 0;
    bool removed = false;
  };
  std::mutex mtx_;
  std::condition_variable cv_;
  std::unordered_map<uint32_t, slot> slots_;
  uint32_t next_id_ = 1;
};

/// Holds every distinct source region of the validated batch `b` in `table`
/// (region_table::hold) until the returned pins are released: a posted
/// batch's sources cannot be deregistered, and so freed, while it may still
/// read them. Error: unknown_region, naming the write whose source is not
/// (or no longer) registered here.
caf::expected<std::vector<region_table::pin>> hold_sources(region_table& table,
                                                           const batch& b);

/// 64 random bits from OpenSSL's CSPRNG (keys, nonces).
uint64_t random_u64();

} // namespace dualpath::transport::bulk
