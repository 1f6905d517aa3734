// The single-pass JSON scanner of safetensors headers (safetensors_json.hpp).
#include "jobs/safetensors_json.hpp"

#include <fmt/format.h>

#include <cstring>

namespace nvio::safetensors::detail {

namespace {

bool is_ws(unsigned char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) noexcept { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string shown_byte(unsigned char c) {
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02x}", c);
}

}  // namespace

void JsonScanner::error(const std::string& problem) const {
  throw JsonSyntaxError{offset(), problem};
}

void JsonScanner::skip_ws() noexcept {
  while (at_ < end_ && is_ws(*at_)) ++at_;
}

char JsonScanner::peek() noexcept {
  skip_ws();
  return at_ < end_ ? static_cast<char>(*at_) : '\0';
}

bool JsonScanner::consume(char c) noexcept {
  skip_ws();
  if (at_ < end_ && *at_ == static_cast<unsigned char>(c)) {
    ++at_;
    return true;
  }
  return false;
}

void JsonScanner::expect(char c, const char* what) {
  if (consume(c)) return;
  if (at_ == end_) error(fmt::format("the text ends where {} was expected", what));
  error(fmt::format("expected {}, found {}", what, shown_byte(*at_)));
}

bool JsonScanner::at_end() noexcept {
  skip_ws();
  return at_ == end_;
}

const char* JsonScanner::next_type() noexcept {
  switch (peek()) {
    case '{': return "object";
    case '[': return "array";
    case '"': return "string";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    case '-': return "number";
    default: return at_ < end_ && is_digit(*at_) ? "number" : "invalid";
  }
}

unsigned JsonScanner::hex4() {
  unsigned v = 0;
  for (int i = 0; i < 4; ++i, ++at_) {
    if (at_ == end_) error("the text ends inside a \\u escape");
    const unsigned char c = *at_;
    unsigned d = 0;
    if (is_digit(c)) {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      error(fmt::format("{} in a \\u escape is not a hex digit", shown_byte(c)));
    }
    v = v * 16 + d;
  }
  return v;
}

// At the byte after a backslash.
void JsonScanner::escape(std::string& out) {
  if (at_ == end_) error("the text ends inside an escape");
  const unsigned char c = *at_++;
  switch (c) {
    case '"': out += '"'; return;
    case '\\': out += '\\'; return;
    case '/': out += '/'; return;
    case 'b': out += '\b'; return;
    case 'f': out += '\f'; return;
    case 'n': out += '\n'; return;
    case 'r': out += '\r'; return;
    case 't': out += '\t'; return;
    case 'u': break;
    default: --at_; error(fmt::format("invalid escape \\{}", static_cast<char>(c)));
  }
  std::uint32_t cp = hex4();
  if (cp >= 0xDC00 && cp <= 0xDFFF) error("a lone trailing surrogate in a \\u escape");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (end_ - at_ < 2 || at_[0] != '\\' || at_[1] != 'u') {
      error("a lone leading surrogate in a \\u escape");
    }
    at_ += 2;
    const std::uint32_t low = hex4();
    if (low < 0xDC00 || low > 0xDFFF) error("a leading surrogate not followed by a trailing one");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  append_utf8(out, cp);
}

// At a byte >= 0x80: one well-formed UTF-8 sequence (Unicode's table 3-7), copied to `out`.
void JsonScanner::utf8_sequence(std::string& out) {
  const unsigned char c = *at_;
  int length = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    error(fmt::format("{} is not valid UTF-8", shown_byte(c)));
  }
  if (end_ - at_ < length) error("the text ends inside a UTF-8 sequence");
  for (int i = 1; i < length; ++i) {
    const unsigned char b = at_[i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
      at_ += i;
      error(fmt::format("{} is not valid UTF-8 (in a sequence)", shown_byte(b)));
    }
  }
  out.append(reinterpret_cast<const char*>(at_), static_cast<std::size_t>(length));
  at_ += length;
}

std::string JsonScanner::string() {
  skip_ws();
  if (at_ == end_ || *at_ != '"') {
    if (at_ == end_) error("the text ends where a string was expected");
    error(fmt::format("expected a string, found {}", shown_byte(*at_)));
  }
  ++at_;
  std::string out;
  for (;;) {
    // The common case: a run of plain ASCII, copied at once.
    const unsigned char* run = at_;
    while (at_ < end_ && *at_ >= 0x20 && *at_ < 0x80 && *at_ != '"' && *at_ != '\\') ++at_;
    out.append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(at_ - run));
    if (at_ == end_) error("the text ends inside a string");
    const unsigned char c = *at_;
    if (c == '"') {
      ++at_;
      return out;
    }
    if (c == '\\') {
      ++at_;
      escape(out);
    } else if (c < 0x20) {
      error(fmt::format("{} (a control character) inside a string", shown_byte(c)));
    } else {
      utf8_sequence(out);
    }
  }
}

void JsonScanner::literal(std::string_view word) {
  if (static_cast<std::size_t>(end_ - at_) < word.size() ||
      std::memcmp(at_, word.data(), word.size()) != 0) {
    error(fmt::format("expected a value, found {}", shown_byte(*at_)));
  }
  at_ += word.size();
}

// At '-' or a digit: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
void JsonScanner::number() {
  if (*at_ == '-') ++at_;
  if (at_ == end_ || !is_digit(*at_)) error("a '-' not followed by a digit");
  if (*at_ == '0') {
    ++at_;
    if (at_ < end_ && is_digit(*at_)) error("a number with a leading zero");
  } else {
    while (at_ < end_ && is_digit(*at_)) ++at_;
  }
  if (at_ < end_ && *at_ == '.') {
    ++at_;
    if (at_ == end_ || !is_digit(*at_)) error("a '.' not followed by a digit");
    while (at_ < end_ && is_digit(*at_)) ++at_;
  }
  if (at_ < end_ && (*at_ == 'e' || *at_ == 'E')) {
    ++at_;
    if (at_ < end_ && (*at_ == '+' || *at_ == '-')) ++at_;
    if (at_ == end_ || !is_digit(*at_)) error("an exponent without digits");
    while (at_ < end_ && is_digit(*at_)) ++at_;
  }
}

bool JsonScanner::unsigned_integer(std::uint64_t& value, int depth, std::string_view* text) {
  skip_ws();
  const unsigned char* start = at_;
  bool ok = at_ < end_ && is_digit(*at_);
  if (!ok) {
    skip_value(depth);  // any value but a number is refused by the caller
  } else {
    number();
    value = 0;
    for (const unsigned char* p = start; p < at_ && ok; ++p) {
      if (!is_digit(*p) || __builtin_mul_overflow(value, 10u, &value) ||
          __builtin_add_overflow(value, static_cast<unsigned>(*p - '0'), &value)) {
        ok = false;  // a fraction, an exponent, or more than 64 bits
      }
    }
  }
  if (text) {
    *text = std::string_view(reinterpret_cast<const char*>(start),
                             static_cast<std::size_t>(at_ - start));
  }
  return ok;
}

std::string_view JsonScanner::skip_value_text(int depth) {
  skip_ws();
  const unsigned char* start = at_;
  skip_value(depth);
  return {reinterpret_cast<const char*>(start), static_cast<std::size_t>(at_ - start)};
}

void JsonScanner::skip_value(int depth) {
  const char c = peek();
  if (c == '{' || c == '[') {
    if (depth > kMaxJsonDepth) throw JsonDepthError{offset()};
    ++at_;
    const char close = c == '{' ? '}' : ']';
    if (consume(close)) return;
    do {
      if (c == '{') {
        string();
        expect(':', "':'");
      }
      skip_value(depth + 1);
    } while (consume(','));
    expect(close, c == '{' ? "',' or '}'" : "',' or ']'");
    return;
  }
  if (c == '"') {
    string();
  } else if (c == 't') {
    literal("true");
  } else if (c == 'f') {
    literal("false");
  } else if (c == 'n') {
    literal("null");
  } else if (c == '-' || (at_ < end_ && is_digit(*at_))) {
    number();
  } else if (at_ == end_) {
    error("the text ends where a value was expected");
  } else {
    error(fmt::format("expected a value, found {}", shown_byte(*at_)));
  }
}

}  // namespace nvio::safetensors::detail
