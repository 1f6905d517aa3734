// What this machine offers: engine availability, direct-I/O support and alignment of a directory,
// and kernel limits. Used by `nvio report`, the engine chooser and tests.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "nvio/export.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

struct EngineProbe {
  bool available = false;
  std::string
      reason;  // why it is available or not, e.g. "io_uring_queue_init: Operation not permitted"
};

// Probes each concrete engine once per process (thread-safe, cached).
const EngineProbe& probe_engine(EngineKind kind);
// The engine `auto` resolves to, and why.
struct AutoChoice {
  EngineKind engine;
  std::string reason;
};
const AutoChoice& auto_engine();

struct DirectIoInfo {
  bool supported = false;
  std::uint32_t mem_align = 0;     // required buffer address alignment (bytes)
  std::uint32_t offset_align = 0;  // required file offset and length alignment (bytes)
  std::string source;              // "statx", "probe" or why unsupported
};
// Probes `dir` by creating (and removing) a small temporary file in it. Throws IoError when the
// directory cannot be used at all.
DirectIoInfo probe_directory(const std::string& dir);

struct SystemInfo {
  std::string kernel;                          // uname sysname and release, e.g. "Linux 6.1.0"
  std::optional<std::uint64_t> memlock_limit;  // bytes; nullopt when unlimited
  // CAP_IPC_LOCK in the process's effective capabilities (root has it): mlock is then not bound
  // by memlock_limit. nullopt when /proc/self/status cannot tell.
  std::optional<bool> memlock_capability;
  std::optional<std::uint64_t> aio_max_nr;  // fs.aio-max-nr, when readable
  std::optional<std::uint64_t> aio_nr;      // fs.aio-nr, when readable
};
SystemInfo system_info();

const char* version() noexcept;

// The bytes an unprivileged writer can still put on the file system of `path` (statvfs's f_bavail),
// or nullopt where it cannot be told: statvfs failed, or the file system reports no size at all
// (ramfs, tmpfs mounted with size=0: 0 blocks, 0 free), which no free-space check may judge.
std::optional<std::uint64_t> free_space(const std::string& path) noexcept;

// The CPU time of this process, user and system, in seconds: all its threads (the handle's
// workers included).
double process_cpu_seconds() noexcept;

// ---- the page cache of a file, for honest measurements --------------------------------------
// A read served from the page cache measures memory, not the drive. These need no privileges.

// Writes back `path`'s dirty pages (fdatasync) and drops its clean ones from the page cache
// (POSIX_FADV_DONTNEED), so that the next read comes from the drive. Throws IoError naming the path
// (NotFound, PermissionDenied, ...); on a file system whose pages are the file itself (tmpfs) the
// pages stay, which page_cache_state() shows.
void evict_page_cache(const std::string& path);

struct PageCacheState {
  std::uint64_t file_bytes = 0;    // the file's size
  std::uint64_t cached_bytes = 0;  // of those, in the page cache (whole pages, at most file_bytes)
  std::uint64_t dirty_bytes = 0;   // of those, not yet written back (cachestat only; else 0)
  std::string method;              // "cachestat" (Linux 6.5 and later) or "mincore"
};
// How much of `path` is in the page cache now. Throws IoError naming the path.
PageCacheState page_cache_state(const std::string& path);

}  // namespace nvio
NVIO_API_END
