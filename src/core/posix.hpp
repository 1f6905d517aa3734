// The library's boundary with the POSIX file calls: file descriptors, open, one statx for every
// fact about an open file, page-cache eviction. Internal to the library (the tests reach it
// through src/); what the CLI needs of it is public (nvio/file_descriptor.hpp, nvio/system.hpp).
// Every call here returns -errno rather than throwing: its caller turns that into a typed error,
// once, with the path and range it was working on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvio/file_descriptor.hpp"
#include "nvio/system.hpp"

namespace nvio::detail {

// The descriptor owner and open(2) wrapper are public (nvio/file_descriptor.hpp): the CLI and
// users handing descriptors to a Handle open files as the library does.
using nvio::FileDescriptor;
using nvio::open_file;

enum class FileType { Regular, Block, Directory, Other };

// What the library needs to know about an open file, all from one statx(2).
struct FileFacts {
  FileType type = FileType::Other;
  std::uint32_t mode = 0;  // st_mode: the type bits and the permissions
  // Bytes: st_size, or for a block device (whose st_size is 0) the ioctl BLKGETSIZE64; -errno
  // when that ioctl failed.
  std::int64_t size = 0;
  std::uint32_t block_size = 0;  // st_blksize, the preferred I/O size; 0 when not reported
  // Direct-I/O alignment: statx's DIO fields where the kernel reports them, else st_blksize as a
  // conservative stand-in. `supported` is false when the file system refuses O_DIRECT.
  DirectIoInfo direct_io;
  // Which file it is: a file replaced under the same name (or a descriptor number reused for
  // another file) has another device or inode.
  std::uint64_t device = 0;
  std::uint64_t inode = 0;

  bool same_file(const FileFacts& other) const noexcept {
    return device == other.device && inode == other.inode;
  }
};

// The size in bytes of the block device open as `fd` (ioctl BLKGETSIZE64), or -errno.
std::int64_t block_device_size(int fd) noexcept;

// Fills `facts` for the file open as `fd`. Returns 0, or -errno when statx failed.
int file_facts(int fd, FileFacts& facts);

// What a file's name refers to now, from one statx of `path` (following symbolic links, as open
// does): its type, mode, size (0 for a block device: ask its descriptor), device and inode. The
// direct-I/O fields are left as they are. Returns 0, or -errno.
int path_facts(const std::string& path, FileFacts& facts) noexcept;

// Drops the clean page-cache pages of `path` in [offset, offset + length) (length 0: to the end of
// the file) after writing back its dirty ones, so that the next buffered read comes from the
// drive. Returns 0, or -errno.
int evict_page_cache(const std::string& path, std::uint64_t offset = 0,
                     std::uint64_t length = 0) noexcept;

// Makes [dst_offset, dst_offset + length) of `dst_fd` share the blocks of [src_offset, src_offset +
// length) of `src_fd` (ioctl FICLONERANGE: a reflink on XFS and btrfs; no data is read or written).
// Offsets and length must be multiples of the file system's block size (the length may instead end
// at the source's end). Returns 0, or -errno: EOPNOTSUPP (or ENOTTY, EINVAL, EXDEV) where the
// file systems cannot share these blocks.
int clone_range(int src_fd, std::uint64_t src_offset, std::uint64_t length, int dst_fd,
                std::uint64_t dst_offset) noexcept;

// Pages of [offset, offset + length) of `fd` (length 0: to the end of the file) in the page cache,
// and how many of them are dirty, by cachestat(2) (Linux 6.5). Returns 0, or -errno: ENOSYS on
// older kernels. An overlayfs file's pages belong to the file beneath it: cachestat counts none.
struct CacheCounts {
  std::uint64_t cached_pages = 0;
  std::uint64_t dirty_pages = 0;
};
int cache_counts(int fd, std::uint64_t offset, std::uint64_t length, CacheCounts& out) noexcept;

// Which pages of [offset, offset + length) of `fd` are in the page cache, by mincore(2) over a
// read-only mapping of the range (a mapping faults nothing in): map[i] is 1 when the page at
// round_down(offset, 4096) + i * 4096 is resident, else 0. Works on any kernel and on overlayfs.
// Returns 0, or -errno (mmap's: a descriptor opened write-only cannot be mapped).
int resident_map(int fd, std::uint64_t offset, std::uint64_t length,
                 std::vector<unsigned char>& map);

// nvio::page_cache_state, with a choice of how (Mincore: never cachestat, for tests of the
// fallback that kernels before 6.5 take).
enum class CacheProbe { Any, Mincore };
PageCacheState page_cache_state(const std::string& path, CacheProbe probe);

// getpid() without a system call each time (a syscall costs about a microsecond in a VM, and the
// handle asks on every call to tell a forked child): cached, and refreshed in a child by a
// pthread_atfork handler. A child made without running the fork handlers (a raw clone) sees its
// parent's pid, as it would see the parent's whole state. Thread-safe.
pid_t current_pid() noexcept;

}  // namespace nvio::detail
