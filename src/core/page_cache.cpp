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

int cache_counts(int fd, std::uint64_t offset, std::uint64_t length, CacheCounts& out) noexcept {
  CachestatRange range{offset, length};
  Cachestat cs{};
  if (::syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) return -errno;
  out.cached_pages = cs.nr_cache;
  out.dirty_pages = cs.nr_dirty;
  return 0;
}

int resident_map(int fd, std::uint64_t offset, std::uint64_t length,
                 std::vector<unsigned char>& map) {
  // The mapping starts on a page; map[i] is the page at page_start + i.
  const std::uint64_t first = offset / kPage * kPage;
  map.clear();
  if (length == 0) return 0;
  const std::uint64_t span = offset + length - first;
  void* p = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first));
  if (p == MAP_FAILED) return -errno;
  map.assign((span + kPage - 1) / kPage, 0);
  const int rc = ::mincore(p, span, map.data()) == 0 ? 0 : -errno;
  ::munmap(p, span);
  for (unsigned char& v : map) v &= 1u;
  return rc;
}

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
  CacheCounts counts;
  if (probe == CacheProbe::Any && cachestat_sees_pages(fd.get()) &&
      cache_counts(fd.get(), 0, 0, counts) == 0) {
    out.cached_bytes = bytes(counts.cached_pages);
    out.dirty_bytes = bytes(counts.dirty_pages);
    out.method = "cachestat";
    return out;
  }
  // A window at a time, to bound the map.
  constexpr std::uint64_t kWindow = std::uint64_t{1} << 30;
  std::vector<unsigned char> map;
  std::uint64_t resident = 0;
  for (std::uint64_t at = 0; at < out.file_bytes; at += kWindow) {
    const std::uint64_t len = std::min(kWindow, out.file_bytes - at);
    const int rc = resident_map(fd.get(), at, len, map);
    if (rc < 0) throw_io_error(IoOp::Stat, path, at, len, -rc, "mincore");
    resident += static_cast<std::uint64_t>(std::count(map.begin(), map.end(), 1));
  }
  out.cached_bytes = bytes(resident);
  out.method = "mincore";
  return out;
}

}  // namespace detail

PageCacheState page_cache_state(const std::string& path) {
  return detail::page_cache_state(path, detail::CacheProbe::Any);
}

}  // namespace nvio
