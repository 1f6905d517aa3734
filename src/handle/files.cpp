#include "handle/files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <vector>

#include "core/fork.hpp"
#include "core/posix.hpp"
#include "core/retry.hpp"
#include "nvio/errors.hpp"
#include "nvio/warnings.hpp"

namespace nvio::detail {
namespace {

// Access mode without O_DIRECT for a descriptor we open ourselves.
int open_flags(engine::Direction dir) {
  return dir == engine::Direction::Read ? O_RDONLY : O_WRONLY | O_CREAT;
}

IoOp access_op(const Operation& op) { return op.is_read() ? IoOp::Read : IoOp::Write; }

// Refuses what cannot be read or written at an offset: directories, and pipes, sockets,
// character devices and anonymous inodes (an io_uring ring, an eventfd), which have no file
// offsets (a read from some of them would never complete).
void check_type(const Operation& op, const FileFacts& facts) {
  if (facts.type == FileType::Directory) {
    throw IsADirectory(access_op(op), op.path, op.offset, op.length, EISDIR,
                       "the path is a directory, not a file");
  }
  if (facts.type == FileType::Other) {
    throw InvalidArgument(fmt::format("{}: not a regular file or block device (mode {:o})", op.path,
                                      facts.mode & S_IFMT));
  }
}

// The facts of the file open as `fd`, for `op`; throws IoError when statx fails.
void stat_fd(const Operation& op, int fd, FileFacts& facts) {
  if (const int rc = file_facts(fd, facts); rc < 0) {
    throw_io_error(IoOp::Stat, op.path, op.offset, op.length, -rc);
  }
}

// The size of the file now: its statx size, or for a block device the ioctl on `fd`.
std::int64_t current_size(const FileFacts& now, int fd) {
  return now.type == FileType::Block ? block_device_size(fd) : now.size;
}

void use(Operation& op, std::shared_ptr<OpenFile> file) {
  op.direct_fd = file->direct_fd;
  op.buffered_fd = file->buffered_fd;
  op.name = file->name;  // outlives op.file, which closes when the operation finishes
  op.path = NameRef(*op.name);
  op.file = std::move(file);
}

}  // namespace

Allocated allocate_past_end(int fd, FileType type, std::int64_t size, std::uint64_t offset,
                            std::uint64_t end) noexcept {
  const auto now = static_cast<std::uint64_t>(std::max<std::int64_t>(size, 0));
  if (type != FileType::Regular || end <= now || end <= offset) return Allocated::Nothing;
  const std::uint64_t from = std::max(now, offset);
  const int rc = retry_interrupted([&] {
    return ::fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(end - from)) == 0
               ? 0
               : -errno;
  });
  if (rc == 0) return Allocated::Range;
  return rc == -EOPNOTSUPP || rc == -ENOSYS ? Allocated::Unsupported : Allocated::Refused;
}

std::string fd_name(int fd) {
  char target[512];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return fmt::format("fd {}", fd);
  return fmt::format("fd {} ({})", fd, std::string_view(target, static_cast<std::size_t>(n)));
}

void check_size(Operation& op, std::int64_t size) {
  op.checked_size = size;
  if (!op.is_read()) return;
  if (size < 0) {
    throw_io_error(IoOp::Stat, op.path, op.offset, op.length, static_cast<int>(-size),
                   "the size of the block device (BLKGETSIZE64)");
  }
  if (op.end() > static_cast<std::uint64_t>(size)) {
    throw ShortFile(IoOp::Read, op.path, op.offset, op.length, static_cast<std::uint64_t>(size));
  }
}

void share_file(Operation& op, const Operation& first) {
  use(op, first.file);
  // The batch's first extent of this file found its size a moment ago.
  check_size(op, first.checked_size);
}

namespace {

// Whether the file has no name left (removed, or replaced by a rename): holding it keeps its disk
// space. Asked through a descriptor the entry owns (a caller's may be closed and its number
// reused).
bool removed(const OpenFile& file) {
  const int fd = file.direct ? file.direct.get() : file.buffered.get();
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 && st.st_nlink == 0;
}

// Every FileCache of the process, for release_removed_files. Constant-initialised (a worker may
// reach it), held across fork (core/fork.hpp).
std::mutex caches_mutex;
std::vector<FileCache*> caches;
std::atomic<std::uint64_t> releases{0};  // removed_files_released()

}  // namespace

FileCache::FileCache(DirectIo direct) : direct_(direct) {
  static const bool registered = (hold_across_fork(caches_mutex), true);
  (void)registered;
  std::lock_guard lock(caches_mutex);
  caches.push_back(this);
}

FileCache::~FileCache() {
  std::lock_guard lock(caches_mutex);
  std::erase(caches, this);
}

std::uint64_t release_removed_files() noexcept {
  std::size_t dropped = 0;
  std::lock_guard lock(caches_mutex);
  for (FileCache* cache : caches) dropped += cache->release_removed();
  if (dropped > 0) return releases.fetch_add(1, std::memory_order_relaxed) + 1;
  return removed_files_released();
}

std::uint64_t removed_files_released() noexcept { return releases.load(std::memory_order_relaxed); }

template <class Drop>
std::size_t FileCache::drop_if(Drop drop) {
  std::size_t dropped = 0;
  for (Table* table : {&read_paths_, &write_paths_, &adopted_}) {
    for (auto it = table->begin(); it != table->end();) {
      if (drop(it->second)) {
        it = table->erase(it);
        ++dropped;
      } else {
        ++it;
      }
    }
  }
  return dropped;
}

std::size_t FileCache::release_removed() {
  std::lock_guard lock(mutex_);
  return drop_if([](const Entry& e) { return removed(*e.file); });
}

std::shared_ptr<OpenFile> FileCache::find(Table& table, const std::string& key) {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  if (now - last_sweep_ >= kIdle) {
    // Busy handles never go idle: removed files are let go of here, once per kIdle.
    last_sweep_ = now;
    drop_if([](const Entry& e) { return removed(*e.file); });
  }
  auto it = table.find(key);
  if (it == table.end()) return nullptr;
  it->second.last_used = now;
  return it->second.file;
}

std::size_t FileCache::capacity() noexcept {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return kCapacity;
  return std::clamp<std::size_t>(static_cast<std::size_t>(lim.rlim_cur / 48), 1, kCapacity);
}

void FileCache::keep(Table& table, const std::string& key, std::shared_ptr<OpenFile> file) {
  const std::size_t most = capacity();
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  if (auto it = table.find(key); it != table.end()) {
    it->second = {std::move(file), now};
    return;
  }
  while (!table.empty() && table.size() >= most) {
    auto oldest = table.begin();
    for (auto it = table.begin(); it != table.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    table.erase(oldest);
  }
  try {
    table.emplace(key, Entry{std::move(file), now});
  } catch (const std::bad_alloc&) {  // not kept: the operation still has it
  }
}

void FileCache::clear() {
  std::lock_guard lock(mutex_);
  drop_if([](const Entry&) { return true; });
}

void FileCache::clear_file(int fd) {
  FileFacts facts;
  if (file_facts(fd, facts) != 0) return;  // not open: an entry under its number is checked anyway
  std::lock_guard lock(mutex_);
  drop_if([&](const Entry& e) { return e.file->facts.same_file(facts); });
}

void FileCache::clear_file(const std::string& path) {
  FileFacts facts;
  const bool exists = path_facts(path, facts) == 0;
  std::lock_guard lock(mutex_);
  read_paths_.erase(path);
  write_paths_.erase(path);
  if (exists) drop_if([&](const Entry& e) { return e.file->facts.same_file(facts); });
}

bool FileCache::release_unused() {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  drop_if([&](const Entry& e) { return now - e.last_used >= kIdle || removed(*e.file); });
  return !read_paths_.empty() || !write_paths_.empty() || !adopted_.empty();
}

std::size_t FileCache::size() const {
  std::lock_guard lock(mutex_);
  return read_paths_.size() + write_paths_.size() + adopted_.size();
}

int FileCache::open_shedding(const std::string& path, int flags) {
  const int fd = open_file(path, flags);
  if (fd != -EMFILE && fd != -ENFILE) return fd;
  clear();
  return open_file(path, flags);
}

std::shared_ptr<OpenFile> FileCache::open_new(Operation& op) {
  auto file = std::make_shared<OpenFile>();
  file->name = std::make_shared<const std::string>(op.path.str());
  const int flags = open_flags(op.direction);
  bool direct_refused = false;
  if (direct_ != DirectIo::Off) {
    const int fd = open_shedding(op.path, flags | O_DIRECT);
    if (fd >= 0) {
      file->direct = FileDescriptor(fd);
    } else if (fd == -EINVAL) {
      direct_refused = true;
    } else {
      throw_io_error(IoOp::Open, op.path, op.offset, op.length, -fd);
    }
  }
  const int fd = open_shedding(op.path, flags);
  if (fd < 0) throw_io_error(IoOp::Open, op.path, op.offset, op.length, -fd);
  file->buffered = FileDescriptor(fd);
  stat_fd(op, fd, file->facts);
  check_type(op, file->facts);
  if (direct_refused) {
    if (direct_ == DirectIo::On) {
      throw IoError(IoOp::Open, op.path, op.offset, op.length, EINVAL,
                    "the file system refuses O_DIRECT and direct=on was requested");
    }
    warn(fmt::format("O_DIRECT is not supported for '{}'; using buffered I/O", op.path),
         "no-direct");
  }
  file->buffered_fd = fd;
  file->direct_fd = file->direct.get();
  return file;
}

void FileCache::open_path(Operation& op) {
  Table& table = op.is_read() ? read_paths_ : write_paths_;
  if (std::shared_ptr<OpenFile> kept = find(table, op.path)) {
    // One statx of the name: is it still the file kept, and how large is it now?
    FileFacts now;
    if (path_facts(op.path, now) == 0 && now.same_file(kept->facts)) {
      check_size(op, current_size(now, kept->any_fd()));
      use(op, std::move(kept));
      return;
    }
  }
  // A new file to write: the removed files kept may hold the blocks it needs.
  if (!op.is_read()) release_removed();
  std::shared_ptr<OpenFile> file = open_new(op);
  check_size(op, file->facts.size);
  use(op, file);
  keep(table, op.path, std::move(file));
}

void FileCache::adopt_fd(Operation& op, int fd) {
  // Two system calls for a descriptor seen before: its flags and one statx (for the size, and to
  // tell whether the number still refers to the same file).
  const int fl = ::fcntl(fd, F_GETFL);
  const int fl_err = errno;
  FileFacts now;
  const int stat_rc = fl < 0 ? 0 : file_facts(fd, now);
  const int access = fl & O_ACCMODE;
  const bool has_direct = fl >= 0 && (fl & O_DIRECT) != 0;
  // Without direct I/O wanted, the caller's buffered descriptor does everything: nothing to keep.
  const bool keeps = fl >= 0 && (has_direct || direct_ != DirectIo::Off);
  const std::string key = keeps ? fmt::format("{}:{}:{}", fd, access, has_direct ? 1 : 0) : "";
  std::shared_ptr<OpenFile> kept = keeps && stat_rc == 0 ? find(adopted_, key) : nullptr;
  if (kept != nullptr && !now.same_file(kept->facts)) kept.reset();
  // The name for messages: the kept file's, else from /proc (a readlink) for a first sight.
  std::string name = kept != nullptr ? std::string() : fd_name(fd);
  op.path = NameRef(kept != nullptr ? *kept->name : name);
  if (fl < 0) {
    throw_io_error(IoOp::Stat, op.path, op.offset, op.length, fl_err,
                   "the file descriptor is not open");
  }
  if (stat_rc < 0) throw_io_error(IoOp::Stat, op.path, op.offset, op.length, -stat_rc);
  if ((fl & O_APPEND) != 0 && !op.is_read()) {
    // pwrite on an O_APPEND descriptor ignores the offset and appends: refuse rather than write
    // the data somewhere other than where it was asked to go.
    throw InvalidArgument(fmt::format(
        "{}: the descriptor was opened with O_APPEND, which ignores write offsets; open it "
        "without O_APPEND",
        op.path));
  }
  check_type(op, now);
  check_size(op, now.size);  // file_facts asked a block device for its size
  if (kept != nullptr) {
    use(op, std::move(kept));
    return;
  }
  auto file = std::make_shared<OpenFile>();
  file->name = std::make_shared<const std::string>(op.path.str());
  file->facts = now;
  if (!keeps) {
    file->buffered_fd = fd;
    use(op, std::move(file));
    return;
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if (has_direct) {
    file->direct_fd = fd;
    // For the unaligned edges; without it an operation that has edges is refused (plan()).
    const int other = open_shedding(proc, access);
    if (other >= 0) {
      file->buffered = FileDescriptor(other);
      file->buffered_fd = other;
    }
  } else {
    file->buffered_fd = fd;
    const int other = open_shedding(proc, access | O_DIRECT);
    if (other >= 0) {
      file->direct = FileDescriptor(other);
      file->direct_fd = other;
    } else if (direct_ == DirectIo::On) {
      throw_io_error(IoOp::Open, op.path, op.offset, op.length, -other,
                     "could not reopen the descriptor with O_DIRECT and direct=on was requested");
    }
  }
  keep(adopted_, key, file);
  use(op, std::move(file));
}

}  // namespace nvio::detail
