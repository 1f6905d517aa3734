// The safetensors format (include/nvio/safetensors.hpp), the I/O: loading through one read batch,
// saving through one write batch into an atomically replaced file. Parsing and serialisation are
// in safetensors_header.cpp.
#include "nvio/safetensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "core/posix.hpp"
#include "nvio/errors.hpp"
#include "nvio/replace_file.hpp"

namespace nvio::safetensors {

namespace {

// How much of the file the first read of a header takes.
constexpr std::size_t kFirstRead = 256 * 1024;

}  // namespace

Header read_safetensors_header(Handle& handle, const std::string& path) {
  detail::FileFacts facts;
  const int rc = detail::path_facts(path, facts);
  if (rc < 0) throw_io_error(IoOp::Stat, path, 0, 0, -rc);
  if (facts.type == detail::FileType::Directory) throw_io_error(IoOp::Open, path, 0, 0, EISDIR);
  if (facts.type != detail::FileType::Regular) {
    throw InvalidArgument(fmt::format("safetensors: '{}' is not a regular file", path));
  }
  const auto file_size = static_cast<std::uint64_t>(facts.size);
  const ReadOptions host{MemoryKind::Host};
  std::vector<unsigned char> bytes(std::min<std::uint64_t>(file_size, kFirstRead));
  handle.read(bytes.data(), bytes.size(), path, 0, host);
  const std::uint64_t n = parse_header_length(bytes, file_size, path);
  const std::size_t first = bytes.size();
  if (kLengthFieldSize + n > first) {
    bytes.resize(kLengthFieldSize + n);
    handle.read(bytes.data() + first, bytes.size() - first, path, first, host);
  }
  return parse_safetensors_header(bytes, file_size, path);
}

void read_safetensors_tensors(Handle& handle, const std::string& path, const Header& header,
                              std::span<void* const> buffers, const ReadOptions& read_options) {
  if (buffers.size() != header.tensors.size()) {
    throw InvalidArgument(fmt::format("safetensors: {} buffers given for the {} tensors of '{}'",
                                      buffers.size(), header.tensors.size(), path));
  }
  std::vector<ReadExtent> extents;
  extents.reserve(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    if (buffers[i] == nullptr || t.byte_size() == 0) continue;
    extents.push_back({buffers[i], static_cast<std::size_t>(t.byte_size()),
                       header.data_offset() + t.begin, path});
  }
  if (!extents.empty()) handle.read_batch(extents, read_options);
}

void read_safetensors_data(Handle& handle, const std::string& path, const Header& header, void* buf,
                           const ReadOptions& read_options) {
  if (header.data_size > 0) {
    handle.read(buf, static_cast<std::size_t>(header.data_size), path, header.data_offset(),
                read_options);
  }
}

Header load_safetensors(Handle& handle, const std::string& path, const Destination& destination,
                        const ReadOptions& read_options) {
  Header header = read_safetensors_header(handle, path);
  std::vector<void*> buffers;
  buffers.reserve(header.tensors.size());
  for (const TensorInfo& t : header.tensors) buffers.push_back(destination(t));
  read_safetensors_tensors(handle, path, header, buffers, read_options);
  return header;
}

void save_safetensors(Handle& handle, const std::string& path, std::span<const TensorData> tensors,
                      const std::optional<std::map<std::string, std::string>>& metadata,
                      const WriteOptions& write_options) {
  if (write_options.truncate != Truncate::No) {
    throw InvalidArgument("safetensors: save writes a new file; truncate must be Truncate::No");
  }
  const SerializedHeader header = serialize_safetensors_header(tensors, metadata);
  ReplacementFile file(path, &handle);
  std::vector<WriteExtent> extents;
  extents.reserve(tensors.size() + 1);
  // The header is host memory whatever the tensors' memory is: one batch holds both.
  extents.push_back({header.bytes.data(), header.bytes.size(), 0, file.fd(), MemoryKind::Host});
  for (std::size_t k = 0; k < header.order.size(); ++k) {
    const TensorData& t = tensors[header.order[k]];
    if (t.length == 0) continue;
    extents.push_back({t.data, t.length, header.bytes.size() + header.begins[k], file.fd()});
  }
  file.writing([&] { handle.write_batch(extents, write_options); });
  file.commit(write_options.durability);
}

}  // namespace nvio::safetensors
