// A file descriptor owned: what a program that hands descriptors to a Handle (its calls that take
// an `int fd`) can open them with, as the library opens its own files.
//
// Thread-safety: FileDescriptor is not thread-safe (one owner); open_file may be called from any
// thread.
#pragma once

#include <string>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// Owns one file descriptor. Move-only; closing is the destructor's job.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// open(2): returns the descriptor, or -errno (never throws). Adds O_CLOEXEC, and retries an open
// that a signal interrupted.
int open_file(const std::string& path, int flags, unsigned mode = 0644) noexcept;

}  // namespace nvio
NVIO_API_END
