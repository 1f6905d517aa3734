#include "nvio/errors.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace nvio {

const char* to_string(IoOp op) noexcept {
  switch (op) {
    case IoOp::Open: return "open";
    case IoOp::Read: return "read";
    case IoOp::Write: return "write";
    case IoOp::Stat: return "stat";
    case IoOp::Sync: return "fdatasync";
    case IoOp::Truncate: return "truncate";
    case IoOp::Submit: return "submit";
    case IoOp::Wait: return "wait";
    case IoOp::Rename: return "rename";
    case IoOp::Remove: return "remove";
  }
  return "?";
}

namespace {

std::string io_message(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                       int err, const std::string& detail) {
  std::string msg =
      fmt::format("{} failed on '{}' at offset {} length {}", to_string(op), path, offset, length);
  if (err != 0) {
    msg += fmt::format(": {} (errno {})", std::strerror(err), err);
  }
  if (!detail.empty()) {
    msg += ": " + detail;
  }
  return msg;
}

}  // namespace

IoError::IoError(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length, int err,
                 const std::string& detail)
    : Error(io_message(op, path, offset, length, err, detail)),
      op_(op),
      path_(std::move(path)),
      offset_(offset),
      length_(length),
      errno_(err) {}

FormatError::FormatError(std::string path, std::string problem)
    : Error(fmt::format("'{}': {}", path, problem)),
      path_(std::move(path)),
      problem_(std::move(problem)) {}

ChecksumMismatch::ChecksumMismatch(std::string name, std::string path, std::uint64_t offset,
                                   std::uint64_t length, std::uint64_t expected,
                                   std::uint64_t actual)
    : FormatError(std::move(path),
                  fmt::format("checksum mismatch in tensor '{}' ({} bytes at offset {}): XXH3 "
                              "{:016x}, {:016x} when it was written",
                              name, length, offset, actual, expected)),
      name_(std::move(name)),
      offset_(offset),
      length_(length),
      expected_(expected),
      actual_(actual) {}

ShortFile::ShortFile(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length,
                     std::uint64_t file_size)
    : ShortFile(op, std::move(path), offset, length, file_size,
                fmt::format("the file holds only {} bytes, the request needs bytes up to {} (end "
                            "of file)",
                            file_size, offset + length)) {}

ShortFile::ShortFile(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length,
                     std::uint64_t file_size, const std::string& detail)
    : IoError(op, std::move(path), offset, length, 0, detail), file_size_(file_size) {}

ShortFile ShortFile::ended_during_read(std::string path, std::uint64_t offset, std::uint64_t length,
                                       std::uint64_t ended_at, std::uint64_t file_size) {
  const std::uint64_t end = offset + length;
  std::string detail =
      file_size < end
          ? fmt::format(
                "the file ended at byte {} during the read and its size is now {}, short "
                "of byte {} that the request needs: it was truncated while being read",
                ended_at, file_size, end)
          : fmt::format(
                "the file ended at byte {} while its size says {} (the request needs "
                "bytes up to {}): the file system reported end of file early",
                ended_at, file_size, end);
  return ShortFile(IoOp::Read, std::move(path), offset, length, file_size, detail);
}

namespace {

std::string gpu_message(const std::string& api, int code, const std::string& code_name,
                        const std::string& detail, const std::string& path, std::uint64_t offset,
                        std::uint64_t length) {
  std::string msg = api + " failed";
  if (!path.empty()) msg += fmt::format(" on '{}' at offset {} length {}", path, offset, length);
  if (!code_name.empty()) msg += fmt::format(": {} ({})", code_name, code);
  if (!detail.empty()) msg += ": " + detail;
  return msg;
}

}  // namespace

GpuError::GpuError(std::string api, int code, std::string code_name, const std::string& detail,
                   std::string path, std::uint64_t offset, std::uint64_t length)
    : Error(gpu_message(api, code, code_name, detail, path, offset, length)),
      api_(std::move(api)),
      code_(code),
      code_name_(std::move(code_name)),
      path_(std::move(path)),
      offset_(offset),
      length_(length) {}

void throw_io_error(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                    int err, const std::string& detail) {
  switch (err) {
    case ENOENT: throw FileNotFound(op, path, offset, length, err, detail);
    case EACCES:
    case EPERM: throw PermissionDenied(op, path, offset, length, err, detail);
    case EROFS: throw ReadOnlyFileSystem(op, path, offset, length, err, detail);
    case EISDIR: throw IsADirectory(op, path, offset, length, err, detail);
    case ENOSPC:
    case EDQUOT: throw NoSpace(op, path, offset, length, err, detail);
    default: throw IoError(op, path, offset, length, err, detail);
  }
}

}  // namespace nvio
