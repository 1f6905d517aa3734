// The library's boundary with the POSIX file calls: file descriptors, open, and direct-I/O facts
// about open files. Internal to the library.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "nvio/system.hpp"

namespace nvio::detail {

// Owns one file descriptor. Move-only; closing is the destructor's job. Not thread-safe.
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

// open(2) wrapper: returns the descriptor, or -errno.
int open_file(const std::string& path, int flags, unsigned mode = 0644) noexcept;

// The size in bytes of the regular file or block device open as `fd`, whose fstat(2) is `st`:
// st_size, or for a block device (whose st_size is 0) the ioctl BLKGETSIZE64. Returns -errno when
// it cannot be had. The one-argument form runs fstat itself.
std::int64_t file_size(int fd, const struct stat& st) noexcept;
std::int64_t file_size(int fd) noexcept;

// Direct-I/O alignment of an open file: statx's DIO fields where the kernel reports them, else
// the block size from fstat as a conservative stand-in. `supported` is false when the file system
// refuses O_DIRECT.
DirectIoInfo direct_io_info(int fd);

}  // namespace nvio::detail
