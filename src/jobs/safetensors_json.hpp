// A single-pass JSON scanner for safetensors headers (internal to safetensors_header.cpp).
//
// The header's JSON is read once, front to back, with no tree built: the caller asks for the next
// token it expects (a string, an unsigned integer, a punctuation mark) and skips values it does
// not need. Every step is linear in the bytes it reads, so a header of n bytes takes O(n) time
// (a generic DOM parser with a per-key callback took quadratic time on 20,000 entries).
//
// It accepts exactly RFC 8259 JSON: whitespace is space, tab, CR and LF; strings are valid UTF-8
// (no overlong forms, no surrogates, nothing above U+10FFFF) with no raw control characters, and
// \u escapes that pair their surrogates; numbers follow the grammar. Any other byte is a
// JsonSyntaxError naming its offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nvio::safetensors::detail {

// The deepest nesting of arrays and objects a header may hold, the top object counting as 1: the
// reference (serde_json's recursion limit) accepts 127 levels and refuses 128.
inline constexpr int kMaxJsonDepth = 127;

// A JSON syntax error at byte `offset` of the JSON text.
struct JsonSyntaxError {
  std::size_t offset;
  std::string problem;
};

// A value too deeply nested (see kMaxJsonDepth).
struct JsonDepthError {
  std::size_t offset;
};

class JsonScanner {
 public:
  JsonScanner(const unsigned char* begin, const unsigned char* end) noexcept
      : begin_(begin), at_(begin), end_(end) {}

  // Skips whitespace; then the next byte, or '\0' at the end of the text.
  char peek() noexcept;
  // Skips whitespace; consumes `c` when it is next and says so.
  bool consume(char c) noexcept;
  // Skips whitespace; consumes `c` or throws JsonSyntaxError ("expected `what`").
  void expect(char c, const char* what);
  // True when nothing but whitespace remains.
  bool at_end() noexcept;
  std::size_t offset() const noexcept { return static_cast<std::size_t>(at_ - begin_); }

  // The string that starts at the next token, unescaped.
  std::string string();
  // The next value as an unsigned integer that fits 64 bits, or false (the value is then skipped,
  // a container there at nesting level `depth`) for any other value. Its text goes to `*text`.
  bool unsigned_integer(std::uint64_t& value, int depth, std::string_view* text = nullptr);
  // Skips the next value, a container there at nesting level `depth`.
  void skip_value(int depth);
  // The value at the cursor skipped; its text (for messages).
  std::string_view skip_value_text(int depth);
  // "object", "array", "string", "number", "boolean", "null" or "invalid" for the next value,
  // without consuming it.
  const char* next_type() noexcept;

 private:
  [[noreturn]] void error(const std::string& problem) const;
  void skip_ws() noexcept;
  void literal(std::string_view word);
  void number();
  void utf8_sequence(std::string& out);
  void escape(std::string& out);
  unsigned hex4();

  const unsigned char* begin_;
  const unsigned char* at_;
  const unsigned char* end_;
};

}  // namespace nvio::safetensors::detail
