#include "core/posix.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/stat.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "core/retry.hpp"

namespace nvio::detail {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

int open_file(const std::string& path, int flags, unsigned mode) noexcept {
  // An open that blocks (a FIFO, a network file system) may be interrupted by a signal.
  return retry_interrupted([&] {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
  });
}

std::int64_t file_size(int fd, const struct stat& st) noexcept {
  if (!S_ISBLK(st.st_mode)) return static_cast<std::int64_t>(st.st_size);
  std::uint64_t bytes = 0;
  if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0) return -errno;
  return static_cast<std::int64_t>(bytes);
}

std::int64_t file_size(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -errno;
  return file_size(fd, st);
}

DirectIoInfo direct_io_info(int fd) {
  DirectIoInfo info;
  // glibc 2.36's statx() wrapper predates the DIO fields, so ask the kernel directly.
  struct statx stx {};
  const long rc = ::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_BLOCKS, &stx);
  if (rc == 0 && (stx.stx_mask & STATX_DIOALIGN) != 0) {
    if (stx.stx_dio_offset_align == 0) {
      info.source = "statx: the file system does not support O_DIRECT for this file";
      return info;
    }
    info.supported = true;
    info.mem_align = stx.stx_dio_mem_align;
    info.offset_align = stx.stx_dio_offset_align;
    info.source = "statx";
    return info;
  }
  // No alignment from the kernel: a page is safe for both on every Linux block device.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_blksize > 0) {
    info.offset_align = static_cast<std::uint32_t>(st.st_blksize);
  } else {
    info.offset_align = 4096;
  }
  info.mem_align = 4096;
  info.supported = true;
  info.source = "st_blksize (statx gave no direct-I/O alignment)";
  return info;
}

}  // namespace nvio::detail
