// A JSON value as a short text for error messages, for the library's configuration and index
// files and for programs that report JSON values of their own (the CLI's --sweep_config).
// Header-only: a template over the JSON type (nlohmann::json or another nlohmann::basic_json), so
// that nvio's headers need no JSON library and libnvio.so exports nothing for it.
//
// nlohmann's dump() recurses once per level of nesting: a value nested 150,000 deep (a 300 KB
// config file, a safetensors header) overflowed the stack inside the very error message that was
// to refuse it. Arrays and objects are therefore dumped only when flat (no array or object inside:
// a shape, a pair of offsets), else described by their size; long texts are cut.
//
// Thread-safety: as reading the value (any thread, while nothing changes it).
#pragma once

#include <cstddef>
#include <string>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// Hidden: compiled into each program that uses it, never exported (its type names the JSON
// library).
template <class Json>
NVIO_LOCAL inline std::string json_excerpt(const Json& v) {
  constexpr std::size_t kMost = 80;
  if (v.is_structured()) {
    for (const auto& item : v) {
      if (item.is_structured()) {
        const std::size_t n = v.size();
        return std::string(v.is_array() ? "an array of " : "an object of ") + std::to_string(n) +
               (v.is_array() ? " item" : " key") + (n == 1 ? "" : "s");
      }
    }
  }
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMost) text = text.substr(0, kMost) + "...";
  return text;
}

}  // namespace nvio
NVIO_API_END
