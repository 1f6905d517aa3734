// evict_page_cache and page_cache_state (nvio/system.hpp): what of a file is in the page cache.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "core/posix.hpp"
#include "nvio/errors.hpp"
#include "nvio/system.hpp"

namespace nvio {
namespace {

constexpr long kPage = 4096;

// cachestat(2), Linux 6.5; glibc 2.36 has neither the wrapper nor the structures.
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct CachestatRange {
  std::uint64_t off;
  std::uint64_t len;  // 0: to the end of the file
};
struct Cachestat {
  std::uint64_t nr_cache;
  std::uint64_t nr_dirty;
  std::uint64_t nr_writeback;
  std::uint64_t nr_evicted;
  std::uint64_t nr_recently_evicted;
};

// Pages of `fd` in [0, size) that are resident, by mincore over read-only mappings of the file (a
// mapping faults nothing in), a window at a time to bound the vector.
int mincore_pages(int fd, std::uint64_t size, std::uint64_t& resident) {
  constexpr std::uint64_t kWindow = std::uint64_t{1} << 30;
  std::vector<unsigned char> vec;
  resident = 0;
  for (std::uint64_t at = 0; at < size; at += kWindow) {
    const std::uint64_t len = std::min(kWindow, size - at);
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (p == MAP_FAILED) return -errno;
    vec.assign((len + kPage - 1) / kPage, 0);
    const int rc = ::mincore(p, len, vec.data()) == 0 ? 0 : -errno;
    ::munmap(p, len);
    if (rc != 0) return rc;
    for (unsigned char v : vec) resident += v & 1u;
  }
  return 0;
}

// Whether the page cache of the file open as `fd` is its own inode's, which cachestat reports. An
// overlayfs file's is not: its pages belong to the upper or lower file beneath, and cachestat of
// the overlay file counts none, while a mapping of it maps that file, so mincore sees them.
bool cachestat_sees_pages(int fd) {
  struct statfs fs {};
  return ::fstatfs(fd, &fs) != 0 || fs.f_type != OVERLAYFS_SUPER_MAGIC;
}

}  // namespace

void evict_page_cache(const std::string& path) {
  {  // opened first on its own, so that a missing or unreadable file is reported as such
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for ever for a writer.
    const int raw = detail::open_file(path, O_RDONLY | O_NONBLOCK);
    if (raw < 0) throw_io_error(IoOp::Open, path, 0, 0, -raw, "to evict it from the page cache");
    const detail::FileDescriptor fd(raw);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_io_error(IoOp::Stat, path, 0, 0, errno);
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
      throw_io_error(IoOp::Stat, path, 0, 0, EINVAL,
                     "not a regular file or block device: it has no page cache to evict");
    }
  }
  const int rc = detail::evict_page_cache(path);
  if (rc < 0) {
    throw_io_error(IoOp::Sync, path, 0, 0, -rc, "evicting its pages from the page cache");
  }
}

namespace detail {

PageCacheState page_cache_state(const std::string& path, CacheProbe probe) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for ever for a writer.
  const int raw = detail::open_file(path, O_RDONLY | O_NONBLOCK);
  if (raw < 0) throw_io_error(IoOp::Open, path, 0, 0, -raw, "to see what of it is cached");
  const detail::FileDescriptor fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io_error(IoOp::Stat, path, 0, 0, errno);
  if (!S_ISREG(st.st_mode)) {
    throw_io_error(IoOp::Stat, path, 0, 0, EINVAL, "not a regular file");
  }
  PageCacheState out;
  out.file_bytes = static_cast<std::uint64_t>(st.st_size);
  const auto bytes = [&](std::uint64_t pages) {
    return std::min(pages * static_cast<std::uint64_t>(kPage), out.file_bytes);
  };
  CachestatRange range{0, 0};
  Cachestat cs{};
  if (probe == CacheProbe::Any && cachestat_sees_pages(fd.get()) &&
      ::syscall(__NR_cachestat, fd.get(), &range, &cs, 0) == 0) {
    out.cached_bytes = bytes(cs.nr_cache);
    out.dirty_bytes = bytes(cs.nr_dirty);
    out.method = "cachestat";
    return out;
  }
  std::uint64_t resident = 0;
  const int rc = mincore_pages(fd.get(), out.file_bytes, resident);
  if (rc < 0) throw_io_error(IoOp::Stat, path, 0, out.file_bytes, -rc, "mincore");
  out.cached_bytes = bytes(resident);
  out.method = "mincore";
  return out;
}

}  // namespace detail

PageCacheState page_cache_state(const std::string& path) {
  return detail::page_cache_state(path, detail::CacheProbe::Any);
}

}  // namespace nvio
