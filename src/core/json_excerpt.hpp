// A JSON value as a short text for error messages. Internal to the library (the tools use it
// too).
//
// nlohmann's dump() recurses once per level of nesting: a value nested 150,000 deep (a 300 KB
// config file, a safetensors header) overflowed the stack inside the very error message that was
// to refuse it. Arrays and objects are therefore dumped only when flat (no array or object inside:
// a shape, a pair of offsets), else described by their size; long texts are cut.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace nvio::detail {

inline std::string json_excerpt(const nlohmann::json& v) {
  constexpr std::size_t kMost = 80;
  if (v.is_structured()) {
    for (const auto& item : v) {
      if (item.is_structured()) {
        const char* what = v.is_array() ? "item" : "key";
        return fmt::format("{} of {} {}{}", v.is_array() ? "an array" : "an object", v.size(), what,
                           v.size() == 1 ? "" : "s");
      }
    }
  }
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMost) text = text.substr(0, kMost) + "...";
  return text;
}

}  // namespace nvio::detail
