#include "nvio/system.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "core/posix.hpp"
#include "core/unique_name.hpp"
#include "nvio/errors.hpp"

namespace nvio {
namespace {

std::optional<std::uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  std::uint64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

}  // namespace

DirectIoInfo probe_directory(const std::string& dir) {
  // The probe file's name is unique to this call (pid, thread, counter): concurrent probes of one
  // directory, from threads of one process or from processes, never meet on one file. O_EXCL
  // keeps a file that happens to exist under the name (left by a crash) from being used; another
  // name is tried then.
  std::string path;
  int direct_fd = -EEXIST;
  for (int attempt = 0; attempt < detail::kUniqueNameAttempts && direct_fd == -EEXIST; ++attempt) {
    path = dir + "/.nvio-probe-" + detail::unique_suffix();
    direct_fd = detail::open_file(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  }
  if (direct_fd >= 0) {
    detail::FileDescriptor fd(direct_fd);
    ::unlink(path.c_str());
    detail::FileFacts facts;
    if (const int rc = detail::file_facts(fd.get(), facts); rc < 0) {
      throw_io_error(IoOp::Stat, path, 0, 0, -rc, "probing the directory");
    }
    return facts.direct_io;
  }
  if (direct_fd != -EINVAL) {
    throw_io_error(IoOp::Open, path, 0, 0, -direct_fd, "probing the directory");
  }
  // Some file systems create the file before refusing O_DIRECT. The name is this call's own, so
  // removing it cannot remove another probe's file.
  ::unlink(path.c_str());
  const int plain_fd = detail::open_file(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (plain_fd < 0) {
    throw_io_error(IoOp::Open, path, 0, 0, -plain_fd, "probing the directory");
  }
  detail::FileDescriptor fd(plain_fd);
  ::unlink(path.c_str());
  DirectIoInfo info;
  info.source = "open with O_DIRECT failed: Invalid argument (the file system refuses it)";
  return info;
}

namespace {

// CAP_IPC_LOCK (capability 14) in the "CapEff:" line of /proc/self/status, a hexadecimal mask.
std::optional<bool> has_ipc_lock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
      return ((mask >> 14) & 1u) != 0;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

SystemInfo system_info() {
  SystemInfo info;
  utsname u{};
  if (::uname(&u) == 0) info.kernel = std::string(u.sysname) + " " + u.release;
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    info.memlock_limit = lim.rlim_cur;
  }
  info.memlock_capability = has_ipc_lock();
  info.aio_max_nr = read_number("/proc/sys/fs/aio-max-nr");
  info.aio_nr = read_number("/proc/sys/fs/aio-nr");
  return info;
}

}  // namespace nvio
