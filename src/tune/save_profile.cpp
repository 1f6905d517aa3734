// save_profile (include/nvio/config.hpp): the configuration file's locked read-modify-replace.
// Here rather than beside the parser in core/config.cpp because it replaces the file through
// nvio/replace_file.hpp (src/jobs), a layer above the core; the text itself comes from the core
// (core/config_text.hpp), the one writer of the format.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "core/config_text.hpp"
#include "core/posix.hpp"
#include "core/retry.hpp"
#include "nvio/config.hpp"
#include "nvio/errors.hpp"
#include "nvio/replace_file.hpp"

namespace nvio {
namespace {

// An exclusive flock(2) on "<config>.lock", held while it lives: serialises the read-modify-write
// of save_profile between threads (each opens its own descriptor, and flock locks belong to the
// open file description) and between processes. The lock file is left in place: removing it
// would let a waiter lock a file that a newcomer no longer sees. Not copyable; owned by one call.
class ConfigLock {
 public:
  explicit ConfigLock(const std::string& config) {
    const std::string path = config + ".lock";
    const int fd = detail::open_file(path, O_RDWR | O_CREAT | O_NOCTTY, 0644);
    if (fd < 0) {
      throw_io_error(IoOp::Open, path, 0, 0, -fd, "cannot open the configuration lock file");
    }
    fd_ = detail::FileDescriptor(fd);
    const int rc =
        detail::retry_interrupted([&] { return ::flock(fd, LOCK_EX) == 0 ? 0 : -errno; });
    if (rc < 0) {
      throw_io_error(IoOp::Open, path, 0, 0, -rc, "cannot lock the configuration lock file");
    }
  }

 private:
  detail::FileDescriptor fd_;  // closing it (the destructor) releases the lock
};

}  // namespace

void save_profile(const std::string& path, const ConfigProfile& profile) {
  if (path.empty()) {
    throw InvalidArgument(
        "no configuration file to save to: NVIO_CONFIG is 'none', or neither "
        "XDG_CONFIG_HOME nor HOME is set");
  }
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) {
      throw_io_error(IoOp::Open, target.parent_path().string(), 0, 0, ec.value(),
                     "cannot create the configuration directory");
    }
  }
  // Read, modify and replace under the lock: two saves at once (threads of one process or
  // processes) would otherwise both read the old file and the later rename would drop the other's
  // profile.
  const ConfigLock lock(path);
  const std::string text =
      detail::config_text_with(load_config(path).value_or(ConfigFile{}), profile);

  // A temporary file beside it, renamed over it once durable, then the directory synced: a crash
  // leaves the old configuration or the new one.
  ReplacementFile out(path);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = detail::retry_interrupted([&]() -> ssize_t {
      const ssize_t r = ::write(out.fd(), text.data() + done, text.size() - done);
      return r < 0 ? -errno : r;
    });
    if (n <= 0) {
      throw_io_error(IoOp::Write, path, done, text.size() - done,
                     n < 0 ? static_cast<int>(-n) : EIO,
                     "writing its temporary file '" + out.temp_path() + "'");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fdatasync(out.fd()) != 0) {
    throw_io_error(IoOp::Sync, path, 0, text.size(), errno,
                   "syncing its temporary file '" + out.temp_path() + "'");
  }
  out.commit(Durability::Data);
}

}  // namespace nvio
