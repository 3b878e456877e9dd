// Enum <-> name tables: the one way Sinew turns its enumerations into the words users type (options,
// metrics, logs) and back. Each enumeration declares one table next to itself,
//
//   inline constexpr NameTable<Mode, 3> kModeNames{{{Mode::kOff, "off"}, {Mode::kOn, "on"}, ...}};
//
// and everything else derives from it: name_of() for output, parse_name() for input (with an error that
// names the option and lists the accepted words), names_list() for help texts. Adding a value means one
// edit to the table; a switch per layer is what this replaces.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "sinew/core/error.hpp"

namespace sinew {

template <class E, std::size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

/// The name of `value`; "?" if the table lacks it (a broken invariant, never user input).
template <class E, std::size_t N>
constexpr std::string_view name_of(const NameTable<E, N>& table, E value) noexcept {
  for (const auto& [e, name] : table)
    if (e == value) return name;
  return "?";
}

/// "a, b, c": the accepted names, for help texts and error messages.
template <class E, std::size_t N>
std::string names_list(const NameTable<E, N>& table, std::string_view separator = ", ") {
  std::string out;
  for (const auto& [e, name] : table) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

/// The value named `text`. Throws InvalidArgument "WHAT: unknown value 'TEXT'; use one of a, b, c".
template <class E, std::size_t N>
E parse_name(const NameTable<E, N>& table, std::string_view text, std::string_view what) {
  for (const auto& [e, name] : table)
    if (name == text) return e;
  SINEW_THROW(InvalidArgument, "{}: unknown value '{}'; use one of {}", what, text, names_list(table));
}

/// Whether `text` names a value of the table.
template <class E, std::size_t N>
constexpr bool is_name(const NameTable<E, N>& table, std::string_view text) noexcept {
  for (const auto& [e, name] : table)
    if (name == text) return true;
  return false;
}

}  // namespace sinew
