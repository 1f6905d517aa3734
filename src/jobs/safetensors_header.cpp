// The safetensors format (include/nvio/safetensors.hpp), the part without I/O: the dtype table,
// header parsing (a single-pass scan, safetensors_json.cpp) and header serialisation. It
// depends on nothing but errors.cpp, so that the fuzz target (tests/fuzz) compiles it on its own.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "jobs/safetensors_json.hpp"
#include "nvio/errors.hpp"
#include "nvio/safetensors.hpp"

namespace nvio::safetensors {

namespace {

using nlohmann::json;

struct DtypeRow {
  Dtype dtype;
  const char* name;
  std::size_t bits;
};

// In Dtype order (the reference's 0.8.0 list).
constexpr std::array<DtypeRow, 22> kDtypes{{
    {Dtype::BOOL, "BOOL", 8},
    {Dtype::F4, "F4", 4},
    {Dtype::F6_E2M3, "F6_E2M3", 6},
    {Dtype::F6_E3M2, "F6_E3M2", 6},
    {Dtype::U8, "U8", 8},
    {Dtype::I8, "I8", 8},
    {Dtype::F8_E5M2, "F8_E5M2", 8},
    {Dtype::F8_E4M3, "F8_E4M3", 8},
    {Dtype::F8_E8M0, "F8_E8M0", 8},
    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {Dtype::I16, "I16", 16},
    {Dtype::U16, "U16", 16},
    {Dtype::F16, "F16", 16},
    {Dtype::BF16, "BF16", 16},
    {Dtype::I32, "I32", 32},
    {Dtype::U32, "U32", 32},
    {Dtype::F32, "F32", 32},
    {Dtype::C64, "C64", 64},
    {Dtype::F64, "F64", 64},
    {Dtype::I64, "I64", 64},
    {Dtype::U64, "U64", 64},
}};

const DtypeRow& row(Dtype dtype) noexcept { return kDtypes[static_cast<std::size_t>(dtype)]; }

constexpr const char* kMetadataKey = "__metadata__";
// Names in messages are cut to this many bytes (a name may be megabytes long).
constexpr std::size_t kShownName = 80;

std::string shown(const std::string& name) {
  if (name.size() <= kShownName) return "'" + name + "'";
  return fmt::format("'{}...' ({} bytes)", name.substr(0, kShownName), name.size());
}

// [2, 3] as the header writes it: "[2,3]".
std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw FormatError(path, "invalid safetensors header: " + problem);
}

using detail::JsonScanner;

// A problem with a well-formed header, thrown inside the scan and turned into a FormatError by
// parse_safetensors_header (which knows the path).
struct StructureError {
  std::string problem;
};

[[noreturn]] void refuse(std::string problem) { throw StructureError{std::move(problem)}; }

// A value's text for a message, cut to kShownName bytes.
std::string excerpt(std::string_view text) {
  if (text.size() <= kShownName) return std::string(text);
  return std::string(text.substr(0, kShownName)) + "...";
}

// Nesting levels: the top object is 1, an entry 2, its members' arrays 3.
constexpr int kEntryDepth = 2;

// The type of the value at the cursor, for a message refusing it; a value that is not JSON at all
// is a syntax error first.
const char* type_to_refuse(JsonScanner& scan, int depth) {
  const char* type = scan.next_type();
  if (std::string_view(type) == "invalid") scan.skip_value(depth);  // throws JsonSyntaxError
  return type;
}

// An array of unsigned integers (a shape, data_offsets) at the scanner's cursor.
std::vector<std::uint64_t> unsigned_array(JsonScanner& scan, const std::string& name,
                                          const char* what) {
  std::vector<std::uint64_t> out;
  if (scan.peek() != '[') {
    refuse(fmt::format("tensor {}: {} must be an array of non-negative integers, found {}",
                       shown(name), what, excerpt(scan.skip_value_text(kEntryDepth + 1))));
  }
  scan.expect('[', "'['");
  if (scan.consume(']')) return out;
  do {
    std::uint64_t v = 0;
    std::string_view text;
    if (!scan.unsigned_integer(v, kEntryDepth + 2, &text)) {
      refuse(fmt::format("tensor {}: {} must hold non-negative integers, found {}", shown(name),
                         what, excerpt(text)));
    }
    out.push_back(v);
  } while (scan.consume(','));
  scan.expect(']', "',' or ']'");
  return out;
}

// The sizes a shape of `dtype` needs, checked as the reference does: the element count, then
// its bits (overflow in either refused), which must make whole bytes.
std::uint64_t shape_bytes(const TensorInfo& t, const std::string& name) {
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const std::uint64_t dim : t.shape) {
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      refuse(fmt::format("tensor {}: shape element {} exceeds 2^63-1", shown(name), dim));
    }
    overflow = overflow || __builtin_mul_overflow(elements, dim, &elements);
  }
  std::uint64_t bits = 0;
  overflow = overflow || __builtin_mul_overflow(elements, row(t.dtype).bits, &bits);
  if (overflow) {
    refuse(fmt::format("tensor {}: shape {} of {} overflows 64 bits of bytes", shown(name),
                       shape_text(t.shape), row(t.dtype).name));
  }
  if (bits % 8 != 0) {
    refuse(fmt::format("tensor {}: shape {} of {} ({} bits each) is not a whole number of bytes",
                       shown(name), shape_text(t.shape), row(t.dtype).name, row(t.dtype).bits));
  }
  return bits / 8;
}

// One tensor entry, the scanner at its value. Members other than the three are skipped (any
// JSON up to the depth limit), as the reference ignores them; a member given twice is refused.
TensorInfo parse_entry(JsonScanner& scan, std::string name, std::uint64_t data_size,
                       std::vector<std::string>& keys) {
  if (scan.peek() != '{') {
    refuse(fmt::format("tensor {}: expected an object, found {}", shown(name),
                       type_to_refuse(scan, kEntryDepth)));
  }
  scan.expect('{', "'{'");
  TensorInfo t;
  bool has_dtype = false;
  bool has_shape = false;
  std::optional<std::vector<std::uint64_t>> offsets;
  keys.clear();
  if (!scan.consume('}')) {
    do {
      keys.push_back(scan.string());
      const std::string& key = keys.back();
      scan.expect(':', "':'");
      if (key == "dtype") {
        std::optional<Dtype> parsed;
        std::string text;
        if (scan.peek() == '"') {
          text = scan.string();
          parsed = parse_dtype(text);
          text = "\"" + text + "\"";
        } else {
          text = scan.skip_value_text(kEntryDepth + 1);
        }
        if (!parsed) refuse(fmt::format("tensor {}: unknown dtype {}", shown(name), excerpt(text)));
        t.dtype = *parsed;
        has_dtype = true;
      } else if (key == "shape") {
        t.shape = unsigned_array(scan, name, "shape");
        has_shape = true;
      } else if (key == "data_offsets") {
        offsets = unsigned_array(scan, name, "data_offsets");
      } else {
        scan.skip_value(kEntryDepth + 1);
      }
    } while (scan.consume(','));
    scan.expect('}', "',' or '}'");
  }
  // Duplicates by sorting: entries have few members, so this stays linear in the header.
  std::sort(keys.begin(), keys.end());
  const auto twice = std::adjacent_find(keys.begin(), keys.end());
  if (twice != keys.end())
    refuse(fmt::format("tensor {}: duplicate key {}", shown(name), shown(*twice)));
  if (!has_dtype) refuse(fmt::format("tensor {} has no \"dtype\"", shown(name)));
  if (!has_shape) refuse(fmt::format("tensor {} has no \"shape\"", shown(name)));
  if (!offsets) refuse(fmt::format("tensor {} has no \"data_offsets\"", shown(name)));
  if (offsets->size() != 2) {
    refuse(fmt::format("tensor {}: data_offsets must be [begin, end], found {}", shown(name),
                       shape_text(*offsets)));
  }
  const std::uint64_t nbytes = shape_bytes(t, name);
  t.begin = (*offsets)[0];
  t.end = (*offsets)[1];
  if (t.end < t.begin) {
    refuse(fmt::format("tensor {}: data_offsets [{}, {}] end before they begin", shown(name),
                       t.begin, t.end));
  }
  if (t.end - t.begin != nbytes) {
    refuse(
        fmt::format("tensor {}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} "
                    "needs {}",
                    shown(name), t.begin, t.end, t.end - t.begin, shape_text(t.shape),
                    row(t.dtype).name, nbytes));
  }
  if (t.end > data_size) {
    refuse(
        fmt::format("tensor {}: data_offsets [{}, {}] reach past the data region of {} "
                    "bytes",
                    shown(name), t.begin, t.end, data_size));
  }
  t.name = std::move(name);
  return t;
}

// "__metadata__": null (no metadata) or an object of strings; a key given twice is refused.
std::optional<std::map<std::string, std::string>> parse_metadata(JsonScanner& scan) {
  const char next = scan.peek();
  if (next == 'n') {
    scan.skip_value(kEntryDepth);
    return std::nullopt;
  }
  if (next != '{') {
    refuse(fmt::format("\"__metadata__\" must be an object of strings, found {}",
                       type_to_refuse(scan, kEntryDepth)));
  }
  scan.expect('{', "'{'");
  std::map<std::string, std::string> metadata;
  if (scan.consume('}')) return metadata;
  do {
    std::string key = scan.string();
    scan.expect(':', "':'");
    if (scan.peek() != '"') {
      refuse(fmt::format("\"__metadata__\" value of {} must be a string, found {}", shown(key),
                         type_to_refuse(scan, kEntryDepth + 1)));
    }
    std::string value = scan.string();
    if (!metadata.emplace(key, std::move(value)).second) {
      refuse("\"__metadata__\": duplicate key " + shown(key));
    }
  } while (scan.consume(','));
  scan.expect('}', "',' or '}'");
  return metadata;
}

// The top object, the scanner after its '{': entries in file order, the metadata, and duplicate
// names found by sorting.
void parse_top(JsonScanner& scan, Header& header) {
  std::vector<std::string> keys;
  bool has_metadata = false;
  if (!scan.consume('}')) {
    do {
      std::string key = scan.string();
      scan.expect(':', "':'");
      if (key == kMetadataKey) {
        if (has_metadata) refuse("duplicate key " + shown(key));
        has_metadata = true;
        header.metadata = parse_metadata(scan);
      } else {
        header.tensors.push_back(parse_entry(scan, std::move(key), header.data_size, keys));
      }
    } while (scan.consume(','));
    scan.expect('}', "',' or '}'");
  }
  std::vector<const std::string*> names;
  names.reserve(header.tensors.size());
  for (const TensorInfo& t : header.tensors) names.push_back(&t.name);
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  const auto twice =
      std::adjacent_find(names.begin(), names.end(),
                         [](const std::string* a, const std::string* b) { return *a == *b; });
  if (twice != names.end()) refuse("duplicate key " + shown(**twice));
}

// The reference's rule: sorted by offsets, the entries tile the data region from 0 to its end.
void check_coverage(const std::vector<TensorInfo>& tensors, std::uint64_t data_size,
                    const std::string& path) {
  std::vector<const TensorInfo*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorInfo& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  std::uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : sorted) {
    if (t->begin < cursor) {
      fail(path,
           fmt::format("tensor {} at [{}, {}] overlaps tensor {} at [{}, {}]", shown(t->name),
                       t->begin, t->end, shown(previous->name), previous->begin, previous->end));
    }
    if (t->begin > cursor) {
      fail(path, fmt::format("bytes [{}, {}) of the data region belong to no tensor (before "
                             "tensor {})",
                             cursor, t->begin, shown(t->name)));
    }
    cursor = t->end;
    previous = t;
  }
  if (cursor != data_size) {
    fail(path, fmt::format("the tensors cover {} bytes, but the data region holds {}: bytes "
                           "[{}, {}) belong to no tensor",
                           cursor, data_size, cursor, data_size));
  }
}

// A JSON string as the reference writes it (serde_json's escapes are nlohmann's: \" \\ \b \f \n
// \r \t, other control characters as \u00xx, everything else as UTF-8 bytes).
std::string json_string(const std::string& text, const char* what) {
  try {
    return json(text).dump();
  } catch (const json::exception&) {
    throw InvalidArgument(fmt::format("safetensors: {} {} is not valid UTF-8", what, shown(text)));
  }
}

}  // namespace

const char* to_string(Dtype dtype) noexcept { return row(dtype).name; }

std::optional<Dtype> parse_dtype(std::string_view text) noexcept {
  for (const DtypeRow& r : kDtypes) {
    if (text == r.name) return r.dtype;
  }
  return std::nullopt;
}

std::size_t dtype_bits(Dtype dtype) noexcept { return row(dtype).bits; }

std::size_t dtype_size(Dtype dtype) noexcept {
  return row(dtype).bits % 8 == 0 ? row(dtype).bits / 8 : 0;
}

const TensorInfo* Header::find(std::string_view name) const noexcept {
  for (const TensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::uint64_t parse_header_length(std::span<const unsigned char> prefix, std::uint64_t file_size,
                                  const std::string& path) {
  if (file_size < kLengthFieldSize || prefix.size() < kLengthFieldSize) {
    fail(path, fmt::format("the file holds {} bytes, fewer than the 8-byte header length",
                           std::min<std::uint64_t>(file_size, prefix.size())));
  }
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kLengthFieldSize; ++i) n |= std::uint64_t{prefix[i]} << (8 * i);
  if (n > kMaxHeaderSize) {
    fail(path, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderSize));
  }
  if (n > file_size - kLengthFieldSize) {
    fail(path, fmt::format("header length {} exceeds the {} bytes after the length field", n,
                           file_size - kLengthFieldSize));
  }
  return n;
}

Header parse_safetensors_header(std::span<const unsigned char> bytes, std::uint64_t file_size,
                                const std::string& path) {
  Header header;
  header.header_size = parse_header_length(bytes, file_size, path);
  const std::uint64_t json_end = kLengthFieldSize + header.header_size;
  if (bytes.size() < json_end) {
    throw InvalidArgument(fmt::format("safetensors: {} bytes of '{}' given, its header needs {}",
                                      bytes.size(), path, json_end));
  }
  header.data_size = file_size - json_end;
  JsonScanner scan(bytes.data() + kLengthFieldSize, bytes.data() + json_end);
  try {
    if (scan.peek() != '{') fail(path, "the JSON does not start with '{'");
    scan.expect('{', "'{'");
    parse_top(scan, header);
    // The format pads the JSON with spaces; any other byte after it (a NUL, text) is refused.
    if (!scan.at_end()) {
      throw detail::JsonSyntaxError{scan.offset(), "trailing characters after the JSON object"};
    }
  } catch (const StructureError& e) {
    fail(path, e.problem);
  } catch (const detail::JsonSyntaxError& e) {
    fail(path, fmt::format("not valid UTF-8 JSON: {} at byte {} of the JSON", e.problem, e.offset));
  } catch (const detail::JsonDepthError& e) {
    fail(path, fmt::format("objects or arrays nested deeper than {} levels (at byte {} of the "
                           "JSON)",
                           detail::kMaxJsonDepth, e.offset));
  }
  check_coverage(header.tensors, header.data_size, path);
  return header;
}

SerializedHeader serialize_safetensors_header(
    std::span<const TensorData> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata) {
  SerializedHeader out;
  out.order.resize(tensors.size());
  std::iota(out.order.begin(), out.order.end(), std::size_t{0});
  // The reference's order: the widest alignment first (Dtype descending), then by name.
  std::sort(out.order.begin(), out.order.end(), [&](std::size_t a, std::size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });

  std::string text = "{";
  if (metadata) {
    text += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : *metadata) {
      if (!first) text += ',';
      first = false;
      text += json_string(key, "metadata key");
      text += ':';
      text += json_string(value, "metadata value");
    }
    text += '}';
  }
  std::uint64_t offset = 0;
  out.begins.reserve(tensors.size());
  // Not a neighbour check on the sorted order: two tensors of one name and different dtypes are
  // not neighbours there.
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (std::size_t k = 0; k < out.order.size(); ++k) {
    const TensorData& t = tensors[out.order[k]];
    if (t.name == kMetadataKey) {
      throw InvalidArgument("safetensors: a tensor cannot be called \"__metadata__\"");
    }
    if (!names.insert(t.name).second) {
      throw InvalidArgument("safetensors: two tensors are called " + shown(t.name));
    }
    std::uint64_t bits = dtype_bits(t.dtype);
    bool overflow = false;
    std::string shape;
    for (std::uint64_t d : t.shape) {
      overflow = overflow || __builtin_mul_overflow(bits, d, &bits);
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    if (overflow || bits % 8 != 0 || bits / 8 != t.length) {
      const std::string needs = overflow        ? "more than 2^64 bits"
                                : bits % 8 != 0 ? fmt::format("{} bits (not whole bytes)", bits)
                                                : std::to_string(bits / 8);
      throw InvalidArgument(
          fmt::format("safetensors: tensor {} has {} bytes, but shape [{}] of "
                      "{} needs {}",
                      shown(t.name), t.length, shape, to_string(t.dtype), needs));
    }
    if (t.data == nullptr && t.length > 0) {
      throw InvalidArgument("safetensors: tensor " + shown(t.name) + " has no data");
    }
    if (text.size() > 1) text += ',';
    text += json_string(t.name, "tensor name");
    text += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                        to_string(t.dtype), shape, offset, offset + t.length);
    out.begins.push_back(offset);
    offset += t.length;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  out.data_size = offset;
  out.bytes.resize(kLengthFieldSize + text.size());
  const std::uint64_t n = text.size();
  for (std::size_t i = 0; i < kLengthFieldSize; ++i) {
    out.bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  }
  std::memcpy(out.bytes.data() + kLengthFieldSize, text.data(), text.size());
  return out;
}

}  // namespace nvio::safetensors
