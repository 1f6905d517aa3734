// The safetensors format: parsing and validating its header, loading tensors into caller buffers,
// and saving, with no torch.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON (an object mapping each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
// "__metadata__" object of string values), then the data region: the tensors' bytes, little
// endian, C order, at [begin, end) from the region's start, back to back.
//
// Parsing is strict: every problem is a FormatError naming the file and the problem; the rules are
// those of the reference library (huggingface/safetensors), with nvio's additions noted where they
// apply (see parse_safetensors_header).
//
// Saving writes the bytes the reference library writes for the same input: tensors sorted by
// dtype, the widest alignment first (the Dtype order below, descending), then by name (byte
// order); compact JSON with "__metadata__" first, then each tensor as
// {"dtype":..,"shape":[..],"data_offsets":[b,e]} in that order; the JSON padded with spaces to a
// multiple of 8 bytes. The reference keeps metadata in a hash map, so with two or more metadata
// keys its key order varies from run to run; nvio writes them sorted by key.
//
// Thread-safety: the functions hold no state of their own; the Handle passed in is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nvio/export.hpp"
#include "nvio/handle.hpp"

NVIO_API_BEGIN

namespace nvio::safetensors {

// The reference's dtypes (safetensors 0.8.0) in its declared order: increasing alignment. Saving
// sorts by this order (descending), so the order is part of the file format and must not change.
// F4 and F6_* are sub-byte: a tensor of them holds a whole number of bytes (the element count
// times their bits is a multiple of 8).
enum class Dtype {
  BOOL,
  F4,
  F6_E2M3,
  F6_E3M2,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64
};

// "F32" for Dtype::F32.
const char* to_string(Dtype dtype) noexcept;
// The dtype spelled `text` ("F32"), or nullopt for an unknown one.
std::optional<Dtype> parse_dtype(std::string_view text) noexcept;
// Bits per element (4 for F4, 6 for F6_*, 8 for U8, ...).
std::size_t dtype_bits(Dtype dtype) noexcept;
// Bytes per element; 0 for the sub-byte dtypes (F4, F6_*).
std::size_t dtype_size(Dtype dtype) noexcept;

// The reference refuses headers longer than this many bytes.
inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
// The header length field before the JSON.
inline constexpr std::size_t kLengthFieldSize = 8;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<std::uint64_t> shape;  // empty: a scalar (one element)
  std::uint64_t begin = 0;           // [begin, end) relative to the data region
  std::uint64_t end = 0;

  std::uint64_t byte_size() const noexcept { return end - begin; }
};

struct Header {
  // In the order the JSON lists them.
  std::vector<TensorInfo> tensors;
  // "__metadata__": absent (nullopt, also for a JSON null) or an object, possibly empty.
  std::optional<std::map<std::string, std::string>> metadata;
  std::uint64_t header_size = 0;  // N, the JSON's length in bytes (padding included)
  std::uint64_t data_size = 0;    // bytes of the data region: the file's size - 8 - N

  // Where the data region starts in the file.
  std::uint64_t data_offset() const noexcept { return kLengthFieldSize + header_size; }
  // The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const noexcept;
};

// The header length N read from the file's first 8 bytes (`prefix` holds at least 8), checked
// against the cap and against `file_size`. Throws FormatError naming `path`.
std::uint64_t parse_header_length(std::span<const unsigned char> prefix, std::uint64_t file_size,
                                  const std::string& path);

// Parses and validates the header of a file of `file_size` bytes whose first bytes are `bytes`
// (at least 8 + N of them; more are ignored), in one pass: time linear in N. Throws FormatError
// naming `path` when:
//   - the file is shorter than 8 bytes, N exceeds kMaxHeaderSize, or 8 + N exceeds the file;
//   - the JSON is not valid UTF-8 JSON, is not an object, is followed by anything but JSON
//     whitespace (the format pads with spaces; a NUL is refused), nests arrays and objects deeper
//     than 127 levels (the reference's limit), or repeats a key in the top object, an entry or
//     the metadata (nvio's addition: the reference keeps the last of duplicate keys);
//   - "__metadata__" is neither null nor an object of string values;
//   - an entry is not an object with "dtype" (a dtype string above), "shape" (an array of
//     integers 0..2^63-1) and "data_offsets" (an array of two non-negative integers); other
//     members of an entry, any JSON, are ignored, as the reference does;
//   - the product of the shape times the dtype's bits overflows 64 bits, is not whole bytes, or
//     differs from end - begin in bytes, or end < begin;
//   - an entry lies outside the data region, two entries overlap, a gap separates them, or the
//     entries do not cover the data region exactly (the reference requires all of these).
// Throws InvalidArgument when `bytes` holds fewer than 8 + N bytes of a file long enough.
Header parse_safetensors_header(std::span<const unsigned char> bytes, std::uint64_t file_size,
                                const std::string& path);

// Reads and parses the header of the file at `path`: its size from one statx, then one read of
// its first bytes (up to 256 KiB; a longer header takes a second read of the rest).
Header read_safetensors_header(Handle& handle, const std::string& path);

// Reads tensor i of `header` into buffers[i] (header.tensors[i].byte_size() bytes there), as one
// read batch; a null buffer skips its tensor. buffers.size() must equal header.tensors.size().
void read_safetensors_tensors(Handle& handle, const std::string& path, const Header& header,
                              std::span<void* const> buffers, const ReadOptions& read_options = {});

// Reads the whole data region into `buf` (header.data_size bytes): tensor i lands at
// buf + header.tensors[i].begin.
void read_safetensors_data(Handle& handle, const std::string& path, const Header& header, void* buf,
                           const ReadOptions& read_options = {});

// Where a tensor's bytes go: `destination` is asked once per tensor, in header order, and returns
// memory for its byte_size() bytes, or nullptr to skip it. Called before any data is read.
using Destination = std::function<void*(const TensorInfo&)>;

// The header, then every tensor into the memory `destination` gives, as one read batch.
Header load_safetensors(Handle& handle, const std::string& path, const Destination& destination,
                        const ReadOptions& read_options = {});

// A tensor to save: `data` holds `length` bytes, the product of `shape` times the dtype's size.
struct TensorData {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<std::uint64_t> shape;
  const void* data = nullptr;
  std::size_t length = 0;
};

// The header as saving writes it: the 8-byte length field, then the padded JSON.
struct SerializedHeader {
  std::vector<unsigned char> bytes;
  // The tensors in file order: indexes into the tensors given, each with its begin offset in the
  // data region.
  std::vector<std::size_t> order;
  std::vector<std::uint64_t> begins;
  std::uint64_t data_size = 0;
};

// Builds the header the reference library writes for `tensors` and `metadata` (see the top of
// this file). Throws InvalidArgument for a name that is not valid UTF-8, a repeated name, a name
// "__metadata__", or a length that does not match the shape and dtype.
SerializedHeader serialize_safetensors_header(
    std::span<const TensorData> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata);

// Saves `tensors` at `path`, atomically: the header and every tensor go to a temporary file in the
// same directory with one write batch, then it is renamed over `path`. With Durability::Data (the
// default) the temporary file is synced (fdatasync) before the rename and the directory after it,
// so that a crash leaves either the old file or the new one. The temporary file is removed on any
// failure. write_options.truncate must be Truncate::No.
void save_safetensors(Handle& handle, const std::string& path, std::span<const TensorData> tensors,
                      const std::optional<std::map<std::string, std::string>>& metadata = {},
                      const WriteOptions& write_options = {Truncate::No, Durability::Data,
                                                           MemoryKind::Auto});

}  // namespace nvio::safetensors
NVIO_API_END
