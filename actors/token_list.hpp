// A prompt's token ids, immutable and shared. A request's prompt (tens of
// thousands of ids at agentic lengths) travels from the replay to the
// scheduler, a prefill engine and a decode engine, and each of them keeps it
// while the request runs; copies of a token_list share one buffer instead of
// copying it (measured: 3-4 copies of ~256 KB per request were most of a
// 48P96D simulation's allocation cost). Serialized (to another node, by
// to_string) it is the plain list of ids, as a vector would be.
//
// Thread safety: the ids never change after construction, so any number of
// threads may read copies concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>

namespace dualpath::actors {

class token_list {
public:
  using value_type = uint32_t;
  using const_iterator = std::vector<uint32_t>::const_iterator;

  token_list() = default;

  /// Takes the ids (implicit: a vector is a token list).
  token_list(std::vector<uint32_t> ids) // NOLINT(google-explicit-constructor)
      : ids_(ids.empty() ? nullptr
                         : std::make_shared<const std::vector<uint32_t>>(
                             std::move(ids))) {
  }

  token_list(std::initializer_list<uint32_t> ids)
      : token_list(std::vector<uint32_t>(ids)) {
  }

  const std::vector<uint32_t>& ids() const {
    return ids_ ? *ids_ : none();
  }

  /// Lets a token list go where a `const std::vector<uint32_t>&` is taken.
  operator const std::vector<uint32_t>&() const { // NOLINT
    return ids();
  }

  size_t size() const {
    return ids().size();
  }

  bool empty() const {
    return ids().empty();
  }

  const_iterator begin() const {
    return ids().begin();
  }

  const_iterator end() const {
    return ids().end();
  }

  const uint32_t* data() const {
    return ids().data();
  }

  uint32_t operator[](size_t i) const {
    return ids()[i];
  }

  /// Whether two lists share one buffer (copies of each other).
  bool shares_with(const token_list& other) const {
    return ids_ != nullptr && ids_ == other.ids_;
  }

  friend bool operator==(const token_list& x, const token_list& y) {
    return x.ids_ == y.ids_ || x.ids() == y.ids();
  }

  friend bool operator!=(const token_list& x, const token_list& y) {
    return !(x == y);
  }

private:
  static const std::vector<uint32_t>& none() {
    static const std::vector<uint32_t> empty;
    return empty;
  }

  std::shared_ptr<const std::vector<uint32_t>> ids_;
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
    // Reading only: the shared buffer is not modified.
    auto& ids = const_cast<std::vector<uint32_t>&>(x.ids());
    return f(ids);
  }
}

} // namespace dualpath::actors
