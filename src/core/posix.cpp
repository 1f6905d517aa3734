#include "core/posix.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/stat.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "core/retry.hpp"

namespace nvio::detail {
namespace {

FileType type_of(std::uint32_t mode) {
  if (S_ISREG(mode)) return FileType::Regular;
  if (S_ISBLK(mode)) return FileType::Block;
  if (S_ISDIR(mode)) return FileType::Directory;
  return FileType::Other;
}

// Where statx gave no direct-I/O alignment: a page is safe for buffer addresses on every Linux
// block device, and the block size for offsets.
DirectIoInfo assumed_direct_io(std::uint32_t block_size) {
  DirectIoInfo info;
  info.supported = true;
  info.offset_align = block_size > 0 ? block_size : 4096;
  info.mem_align = 4096;
  info.source = "st_blksize (statx gave no direct-I/O alignment)";
  return info;
}

}  // namespace

namespace {

// One statx of `path` relative to `dirfd` (`flags` as statx takes them) into the facts every
// answer has: type, mode, size, block size, device and inode. Returns 0, or -errno.
int basic_facts(int dirfd, const char* path, int flags, unsigned mask, struct statx& stx,
                FileFacts& facts) noexcept {
  // glibc 2.36's statx() wrapper predates the DIO fields, so ask the kernel directly. The type,
  // mode, size and block size are in every statx answer; the DIO fields only where the kernel
  // sets STATX_DIOALIGN in the mask it returns.
  if (::syscall(SYS_statx, dirfd, path, flags, mask, &stx) != 0) {
    const int err = errno;
    // A seccomp filter that predates statx (older container runtimes) answers ENOSYS or EPERM:
    // fstat has the same facts but the direct-I/O alignment.
    struct stat st {};
    if ((err != ENOSYS && err != EPERM) || ::fstatat(dirfd, path, &st, flags) != 0) return -err;
    stx.stx_mask = STATX_BASIC_STATS;
    stx.stx_mode = static_cast<std::uint16_t>(st.st_mode);
    stx.stx_size = static_cast<std::uint64_t>(st.st_size);
    stx.stx_blksize = st.st_blksize > 0 ? static_cast<std::uint32_t>(st.st_blksize) : 0;
    stx.stx_dev_major = major(st.st_dev);
    stx.stx_dev_minor = minor(st.st_dev);
    stx.stx_ino = st.st_ino;
  }
  facts.mode = stx.stx_mode;
  facts.type = type_of(stx.stx_mode);
  facts.block_size = stx.stx_blksize;
  facts.size = static_cast<std::int64_t>(stx.stx_size);
  facts.device = makedev(stx.stx_dev_major, stx.stx_dev_minor);
  facts.inode = stx.stx_ino;
  return 0;
}

}  // namespace

int path_facts(const std::string& path, FileFacts& facts) noexcept {
  struct statx stx {};
  return basic_facts(AT_FDCWD, path.c_str(), 0, STATX_TYPE | STATX_MODE | STATX_SIZE | STATX_INO,
                     stx, facts);
}

std::int64_t block_device_size(int fd) noexcept {
  std::uint64_t bytes = 0;
  return ::ioctl(fd, BLKGETSIZE64, &bytes) == 0 ? static_cast<std::int64_t>(bytes) : -errno;
}

int file_facts(int fd, FileFacts& facts) {
  struct statx stx {};
  if (const int rc = basic_facts(fd, "", AT_EMPTY_PATH,
                                 STATX_TYPE | STATX_MODE | STATX_SIZE | STATX_INO | STATX_DIOALIGN,
                                 stx, facts);
      rc < 0) {
    return rc;
  }
  if (facts.type == FileType::Block) facts.size = block_device_size(fd);
  if ((stx.stx_mask & STATX_DIOALIGN) == 0) {
    facts.direct_io = assumed_direct_io(facts.block_size);
  } else if (stx.stx_dio_offset_align == 0) {
    facts.direct_io = DirectIoInfo{};
    facts.direct_io.source = "statx: the file system does not support O_DIRECT for this file";
  } else {
    facts.direct_io = DirectIoInfo{};
    facts.direct_io.supported = true;
    facts.direct_io.mem_align = stx.stx_dio_mem_align;
    facts.direct_io.offset_align = stx.stx_dio_offset_align;
    facts.direct_io.source = "statx";
  }
  return 0;
}

namespace {

std::atomic<pid_t> g_pid{0};

}  // namespace

pid_t current_pid() noexcept {
  static const bool cached = [] {
    g_pid.store(::getpid(), std::memory_order_relaxed);
    return ::pthread_atfork(nullptr, nullptr,
                            [] { g_pid.store(::getpid(), std::memory_order_relaxed); }) == 0;
  }();
  return cached ? g_pid.load(std::memory_order_relaxed) : ::getpid();
}
namespace {
// Made when the library is loaded, for the reason given at locked_regions() (aligned_buffer.cpp).
[[maybe_unused]] const pid_t g_pid_at_load = current_pid();
}  // namespace

int evict_page_cache(const std::string& path, std::uint64_t offset, std::uint64_t length) noexcept {
  // O_NONBLOCK: a FIFO opened for reading would wait for a writer (the callers refuse one).
  const int raw = open_file(path, O_RDONLY | O_NONBLOCK);
  if (raw < 0) return raw;
  const FileDescriptor fd(raw);
  // Dirty pages cannot be dropped: write them back first (an already clean file costs nothing).
  // The clean ones are dropped even when that fails.
  const int synced = ::fdatasync(fd.get()) == 0 ? 0 : -errno;
  // posix_fadvise returns the error number itself instead of setting errno.
  const int dropped = -::posix_fadvise(fd.get(), static_cast<off_t>(offset),
                                       static_cast<off_t>(length), POSIX_FADV_DONTNEED);
  return synced != 0 ? synced : dropped;
}

int clone_range(int src_fd, std::uint64_t src_offset, std::uint64_t length, int dst_fd,
                std::uint64_t dst_offset) noexcept {
  file_clone_range range{};
  range.src_fd = src_fd;
  range.src_offset = src_offset;
  range.src_length = length;
  range.dest_offset = dst_offset;
  return retry_interrupted([&] { return ::ioctl(dst_fd, FICLONERANGE, &range) == 0 ? 0 : -errno; });
}

}  // namespace nvio::detail

namespace nvio {

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
  return detail::retry_interrupted([&] {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
  });
}

std::optional<std::uint64_t> free_space(const std::string& path) noexcept {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0 || vfs.f_blocks == 0) return std::nullopt;
  return std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

double process_cpu_seconds() noexcept {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return seconds(ru.ru_utime) + seconds(ru.ru_stime);
}

}  // namespace nvio
