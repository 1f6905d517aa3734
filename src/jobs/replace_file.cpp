#include "nvio/replace_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "core/posix.hpp"
#include "core/unique_name.hpp"

namespace nvio {
namespace {

constexpr const char* kTempSuffix = ".nvio-tmp";
// Bases longer than this are shortened in temporary names, which then stay within NAME_MAX (255):
// 1 + 120 + 1 + host (63) + 1 + start (20) + 1 + suffix (36) + 9.
constexpr std::size_t kLongestBase = 120;

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// This machine's host name as it goes into temporary names: letters, digits and '-' (so that it
// holds no '.', the names' separator), at most 63 characters.
const std::string& host_name() {
  static const std::string host = [] {
    char buf[256] = {};
    std::string h = ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
    if (h.size() > 63) h.resize(63);
    for (char& c : h) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (!ok) c = '-';
    }
    return h.empty() ? std::string("host") : h;
  }();
  return host;
}

// Field 22 of /proc/<pid>/stat ("self" or a number): when the process started, in clock ticks
// after boot. Nothing when it cannot be read.
std::optional<unsigned long long> start_time(const std::string& pid) {
  std::FILE* f = std::fopen(("/proc/" + pid + "/stat").c_str(), "re");
  if (f == nullptr) return std::nullopt;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string text(buf, n);
  const std::size_t paren = text.rfind(')');  // the command name (field 2) may hold spaces
  if (paren == std::string::npos) return std::nullopt;
  std::size_t at = paren + 1;
  for (int field = 3; field <= 22; ++field) {
    while (at < text.size() && text[at] == ' ') ++at;
    const std::size_t end = text.find(' ', at);
    if (end == std::string::npos) return std::nullopt;
    if (field == 22) {
      const std::string value = text.substr(at, end - at);
      if (!all_digits(value)) return std::nullopt;
      return std::stoull(value);
    }
    at = end;
  }
  return std::nullopt;
}

unsigned long long own_start_time() {
  static const unsigned long long start = start_time("self").value_or(0);
  return start;
}

// The base as it appears in temporary names (see the header).
std::string name_base(const std::string& base) {
  if (base.size() <= kLongestBase) return base;
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : base) hash = (hash ^ c) * 0x100000001b3ULL;
  return fmt::format("{}~{:016x}", base.substr(0, 64), hash);
}

std::pair<std::string, std::string> split_target(const std::string& target) {
  const std::filesystem::path p(target);
  std::string dir = p.parent_path().string();
  return {dir.empty() ? std::string(".") : dir, p.filename().string()};
}

// Whether the process that made a temporary may still be writing it, judged from its name: any
// doubt (another host, an unknown start time, a process that exists but cannot be examined) says
// it may.
bool writer_may_run(const TemporaryWriter& w) {
  if (w.host != host_name() || w.start == 0 || own_start_time() == 0) return true;
  if (w.pid <= 0) return true;
  if (::kill(static_cast<pid_t>(w.pid), 0) != 0 && errno == ESRCH) return false;
  const std::optional<unsigned long long> start = start_time(std::to_string(w.pid));
  return !start.has_value() || *start == w.start;  // another start: the pid was reused
}

// Removes `name` in `dirfd` unless someone holds its flock (a writer this host's /proc does not
// show, e.g. in another pid namespace). Returns whether it removed it. The lock is tried for up to
// kLockPatience: a killed writer's descriptors can outlive it for a moment, since the kernel tears
// down its io_uring instance (which holds the files of requests in flight) asynchronously.
bool remove_unlocked(int dirfd, const std::string& name) {
  constexpr auto kLockPatience = std::chrono::milliseconds(500);
  constexpr auto kLockPoll = std::chrono::milliseconds(5);
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const FileDescriptor owner(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const auto give_up = std::chrono::steady_clock::now() + kLockPatience;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) break;  // no flock on this file system: the name decided
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(kLockPoll);
  }
  return ::unlinkat(dirfd, name.c_str(), 0) == 0;
}

// A replaced file at least this large (in allocated bytes) is freed after commit() returns: see
// hold_old_file. Smaller ones free fast enough in the rename.
constexpr std::uint64_t kFreeLaterBytes = std::uint64_t{64} << 20;

// A descriptor of the file about to be replaced when it is large (-1 otherwise): while it is
// open, the rename does not free the old file's blocks, which took ~0.5 s per GiB inside
// rename(2) on ext4. release_later frees them off the saving thread.
int hold_old_file(const std::string& path) noexcept {
  const int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_blocks) * 512 < kFreeLaterBytes) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Closes `fd` (the replaced file, its name already gone) on a thread of its own, which frees its
// blocks after the save has returned (a process exit closes it too); here when no thread can be
// had.
void release_later(int fd) noexcept {
  if (fd < 0) return;
  try {
    std::thread([fd] { ::close(fd); }).detach();
  } catch (...) {
    ::close(fd);
  }
}

}  // namespace

std::optional<TemporaryWriter> temporary_writer(const std::string& base, const std::string& name) {
  const std::string prefix = "." + name_base(base) + ".";
  const std::string suffix = kTempSuffix;
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string middle =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  std::vector<std::string> fields;  // host, start, pid-tid-n
  std::size_t at = 0;
  while (fields.size() < 4) {
    const std::size_t dot = middle.find('.', at);
    fields.push_back(middle.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  if (fields.size() != 3 || fields[0].empty() || !all_digits(fields[1])) return std::nullopt;
  const std::size_t dash = fields[2].find('-');
  const std::string pid = fields[2].substr(0, dash);
  if (dash == std::string::npos || !all_digits(pid) || pid.size() > 9 || fields[1].size() > 20) {
    return std::nullopt;
  }
  return TemporaryWriter{fields[0], std::stoull(fields[1]), std::stol(pid)};
}

std::size_t remove_stale_temporaries(const std::string& target) noexcept {
  try {
    const auto [dir, base] = split_target(target);
    if (base.empty()) return 0;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return 0;
    std::vector<std::string> stale;
    while (const dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      const std::optional<TemporaryWriter> w = temporary_writer(base, name);
      if (w.has_value() && !writer_may_run(*w)) stale.push_back(name);
    }
    std::size_t removed = 0;
    for (const std::string& name : stale) removed += remove_unlocked(::dirfd(d), name) ? 1 : 0;
    ::closedir(d);
    return removed;
  } catch (...) {  // out of memory: the clean-up is best effort
    return 0;
  }
}

TemporaryFile create_temporary(const std::string& target) {
  remove_stale_temporaries(target);
  const auto [dir, base] = split_target(target);
  const std::string stem = (std::filesystem::path(dir) / ("." + name_base(base))).string() + "." +
                           host_name() + "." + std::to_string(own_start_time()) + ".";
  TemporaryFile t;
  int fd = -EEXIST;
  for (int attempt = 0; attempt < detail::kUniqueNameAttempts && fd == -EEXIST; ++attempt) {
    t.path = stem + detail::unique_suffix() + kTempSuffix;
    fd = open_file(t.path, O_WRONLY | O_CREAT | O_EXCL, 0666);
  }
  if (fd < 0) {
    throw_io_error(IoOp::Open, target, 0, 0, -fd,
                   "cannot create its temporary file '" + t.path + "'");
  }
  // Tells remove_stale_temporaries of a writer it cannot see in /proc that this file is in use; a
  // file system without flock still has the name's pid and start time.
  (void)::flock(fd, LOCK_EX | LOCK_NB);
  t.fd = fd;
  return t;
}

ReplacementFile::ReplacementFile(std::string path, Handle* writer)
    : path_(std::move(path)), writer_(writer) {
  TemporaryFile t = create_temporary(path_);
  temp_ = std::move(t.path);
  fd_ = t.fd;
}

ReplacementFile::ReplacementFile(ReplacementFile&& other) noexcept
    : path_(std::move(other.path_)),
      writer_(other.writer_),
      temp_(std::move(other.temp_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)) {}

ReplacementFile::~ReplacementFile() { discard(); }

void ReplacementFile::release_from_writer() noexcept {
  if (writer_ == nullptr || fd_ < 0) return;
  try {
    writer_->close_file(fd_);
  } catch (...) {  // an optimisation only: the handle lets go of the file within a second anyway
  }
}

void ReplacementFile::discard() noexcept {
  release_from_writer();
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!committed_) {
    ::unlink(temp_.c_str());
    committed_ = true;
  }
}

void ReplacementFile::rethrow_for_target(const IoError& e) const {
  if (e.error_code() == 0 || e.path().find(temp_) == std::string::npos) throw;
  throw_io_error(e.op(), path_, e.offset(), e.length(), e.error_code(),
                 fmt::format("writing its temporary file '{}'", temp_));
}

void ReplacementFile::commit(Durability durability) {
  release_from_writer();
  // close(2) may report a write-back error of a network file system: a failed close is a failed
  // save.
  if (::close(std::exchange(fd_, -1)) != 0 && errno != EINTR) {
    const int err = errno;
    discard();
    throw_io_error(IoOp::Write, path_, 0, 0, err,
                   "closing its temporary file '" + temp_ + "' failed");
  }
  const int old = hold_old_file(path_);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    if (old >= 0) ::close(old);
    discard();
    throw_io_error(IoOp::Rename, path_, 0, 0, err, "cannot rename '" + temp_ + "' over it");
  }
  release_later(old);
  committed_ = true;
  if (durability != Durability::Data) return;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = open_file(dir, O_RDONLY | O_DIRECTORY);
  if (dfd < 0) throw_io_error(IoOp::Open, dir, 0, 0, -dfd, "opening the directory to sync it");
  const FileDescriptor owner(dfd);
  if (::fsync(dfd) != 0) {
    throw_io_error(IoOp::Sync, dir, 0, 0, errno, "syncing the directory after the rename");
  }
}

}  // namespace nvio
