// Names of enumerators as tables: the one lookup behind `to_string(E)` and
// `from_string(str, E&)` of an enum whose values are 0, 1, 2, ... in
// declaration order (every `enum class : uint8_t` of dualpath: error codes,
// modes, backends), with one fallback for a value the table does not name
// ("<type>(<number>)", e.g. a code from a newer peer).
//
// A table lists the words in declaration order, one per enumerator:
//   constexpr std::string_view io_mode_names[] = {"buffered", "direct"};
// tests/config/enum_names.cpp checks every table against its enum.
//
// Thread safety: pure functions over constant tables. Header-only, so every
// module (gpu/ included) can use it without linking config/.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dualpath::config {

/// The word of `x` in `names`, or "<type>(<number>)" when `x` is past the
/// table.
template <class E, size_t N>
std::string name_of(E x, const std::string_view (&names)[N],
                    std::string_view type) {
  auto i = static_cast<size_t>(x);
  if (i < N)
    return std::string{names[i]};
  return std::string{type} + "(" + std::to_string(static_cast<int>(x)) + ")";
}

/// Sets `x` to the enumerator whose word is `str`; false (and `x` unchanged)
/// when the table has no such word.
template <class E, size_t N>
bool parse_name(std::string_view str, const std::string_view (&names)[N],
                E& x) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == str) {
      x = static_cast<E>(i);
      return true;
    }
  return false;
}

} // namespace dualpath::config
