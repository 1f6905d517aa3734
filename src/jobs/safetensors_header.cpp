// The safetensors format (include/nvio/safetensors.hpp), the part without I/O: the dtype table,
// header parsing with nlohmann::json (kept out of the public header) and header serialisation. It
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

#include "core/json_excerpt.hpp"
#include "nvio/errors.hpp"
#include "nvio/safetensors.hpp"

namespace nvio::safetensors {

namespace {

using nlohmann::json;

struct DtypeRow {
  Dtype dtype;
  const char* name;
  std::size_t size;
};

// In Dtype order.
constexpr std::array<DtypeRow, 15> kDtypes{{
    {Dtype::BOOL, "BOOL", 1},
    {Dtype::U8, "U8", 1},
    {Dtype::I8, "I8", 1},
    {Dtype::F8_E5M2, "F8_E5M2", 1},
    {Dtype::F8_E4M3, "F8_E4M3", 1},
    {Dtype::I16, "I16", 2},
    {Dtype::U16, "U16", 2},
    {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},
    {Dtype::I32, "I32", 4},
    {Dtype::U32, "U32", 4},
    {Dtype::F32, "F32", 4},
    {Dtype::F64, "F64", 8},
    {Dtype::I64, "I64", 8},
    {Dtype::U64, "U64", 8},
}};

const DtypeRow& row(Dtype dtype) noexcept { return kDtypes[static_cast<std::size_t>(dtype)]; }

constexpr const char* kMetadataKey = "__metadata__";
// Deepest nesting a valid header has: the top object (0), an entry (1), its shape (2).
constexpr int kMaxDepth = 2;
// Names in messages are cut to this many bytes (a name may be megabytes long).
constexpr std::size_t kShownName = 80;

std::string shown(const std::string& name) {
  if (name.size() <= kShownName) return "'" + name + "'";
  return fmt::format("'{}...' ({} bytes)", name.substr(0, kShownName), name.size());
}

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw FormatError(path, "invalid safetensors header: " + problem);
}

// Thrown from the parser callback, turned into FormatError by the caller (which knows the path).
struct StructureError {
  std::string problem;
};

// nlohmann keeps the last of duplicate keys silently, and its objects forget the order of their
// keys; the callback sees every key and every nesting level, so it refuses duplicates and needless
// depth while parsing, and lists the top object's keys in file order in `top_keys`.
json parse_json(const unsigned char* begin, const unsigned char* end, const std::string& path,
                std::vector<std::string>& top_keys) {
  std::vector<std::unordered_set<std::string>> keys;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > kMaxDepth) {
          throw StructureError{"objects or arrays nested deeper than a header's entries"};
        }
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end: keys.pop_back(); break;
      case json::parse_event_t::key:
        if (!keys.back().insert(parsed.get_ref<const std::string&>()).second) {
          throw StructureError{"duplicate key " + shown(parsed.get_ref<const std::string&>())};
        }
        if (depth == 1) top_keys.push_back(parsed.get_ref<const std::string&>());
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback);
  } catch (const StructureError& e) {
    fail(path, e.problem);
  } catch (const json::exception& e) {
    fail(path, std::string("not valid UTF-8 JSON: ") + e.what());
  }
}

std::uint64_t unsigned_member(const json& v, const std::string& name, const char* what,
                              const std::string& path) {
  if (!v.is_number_unsigned()) {
    fail(path, fmt::format("tensor {}: {} must hold non-negative integers, found {}", shown(name),
                           what, detail::json_excerpt(v)));
  }
  return v.get<std::uint64_t>();
}

const json& member(const json& entry, const char* key, const std::string& name,
                   const std::string& path) {
  const auto it = entry.find(key);
  if (it == entry.end()) fail(path, fmt::format("tensor {} has no \"{}\"", shown(name), key));
  return *it;
}

TensorInfo parse_entry(const std::string& name, const json& entry, std::uint64_t data_size,
                       const std::string& path) {
  if (!entry.is_object()) {
    fail(path,
         fmt::format("tensor {}: expected an object, found {}", shown(name), entry.type_name()));
  }
  TensorInfo t;
  t.name = name;
  const json& dtype = member(entry, "dtype", name, path);
  const std::optional<Dtype> parsed =
      dtype.is_string() ? parse_dtype(dtype.get_ref<const std::string&>()) : std::nullopt;
  if (!parsed)
    fail(path,
         fmt::format("tensor {}: unknown dtype {}", shown(name), detail::json_excerpt(dtype)));
  t.dtype = *parsed;

  const json& shape = member(entry, "shape", name, path);
  if (!shape.is_array()) fail(path, fmt::format("tensor {}: shape is not an array", shown(name)));
  // Elements are counted in the order the reference does, so an overflow is found where it finds
  // one (a zero after two huge dimensions still overflows).
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const json& d : shape) {
    const std::uint64_t dim = unsigned_member(d, name, "shape", path);
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, fmt::format("tensor {}: shape element {} exceeds 2^63-1", shown(name), dim));
    }
    t.shape.push_back(dim);
    overflow = overflow || __builtin_mul_overflow(elements, dim, &elements);
  }
  std::uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(elements, row(t.dtype).size, &nbytes);
  if (overflow) {
    fail(path, fmt::format("tensor {}: shape {} of {} overflows 64 bits of bytes", shown(name),
                           detail::json_excerpt(shape), row(t.dtype).name));
  }

  const json& offsets = member(entry, "data_offsets", name, path);
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(path, fmt::format("tensor {}: data_offsets must be [begin, end], found {}", shown(name),
                           detail::json_excerpt(offsets)));
  }
  t.begin = unsigned_member(offsets[0], name, "data_offsets", path);
  t.end = unsigned_member(offsets[1], name, "data_offsets", path);
  if (t.end < t.begin) {
    fail(path, fmt::format("tensor {}: data_offsets [{}, {}] end before they begin", shown(name),
                           t.begin, t.end));
  }
  if (t.end - t.begin != nbytes) {
    fail(path, fmt::format("tensor {}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} "
                           "needs {}",
                           shown(name), t.begin, t.end, t.end - t.begin,
                           detail::json_excerpt(shape), row(t.dtype).name, nbytes));
  }
  if (t.end > data_size) {
    fail(path, fmt::format("tensor {}: data_offsets [{}, {}] reach past the data region of {} "
                           "bytes",
                           shown(name), t.begin, t.end, data_size));
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& path) {
  if (!value.is_object()) {
    fail(path,
         fmt::format("\"__metadata__\" must be an object of strings, found {}", value.type_name()));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      fail(path, fmt::format("\"__metadata__\" value of {} must be a string, found {}", shown(key),
                             v.type_name()));
    }
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
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

std::size_t dtype_size(Dtype dtype) noexcept { return row(dtype).size; }

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
  if (header.header_size == 0 || bytes[kLengthFieldSize] != '{') {
    fail(path, "the JSON does not start with '{'");
  }
  std::vector<std::string> keys;
  const json doc = parse_json(bytes.data() + kLengthFieldSize, bytes.data() + json_end, path, keys);
  if (!doc.is_object()) fail(path, "the JSON is not an object");
  header.tensors.reserve(keys.size());
  for (const std::string& key : keys) {
    const json& value = doc.at(key);
    if (key == kMetadataKey) {
      if (!value.is_null()) header.metadata = parse_metadata(value, path);
      continue;
    }
    header.tensors.push_back(parse_entry(key, value, header.data_size, path));
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
    std::uint64_t nbytes = dtype_size(t.dtype);
    std::string shape;
    for (std::uint64_t d : t.shape) {
      if (__builtin_mul_overflow(nbytes, d, &nbytes))
        nbytes = std::numeric_limits<std::uint64_t>::max();
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    if (nbytes != t.length) {
      throw InvalidArgument(
          fmt::format("safetensors: tensor {} has {} bytes, but shape [{}] of "
                      "{} needs {}",
                      shown(t.name), t.length, shape, to_string(t.dtype), nbytes));
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
