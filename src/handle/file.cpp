// nvio::File (nvio/file.hpp): a file opened once, whose operations go to the handle's workers
// with the descriptors and facts it holds (Handle::run_opened, detail::use_opened).
#include "nvio/file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <limits>
#include <mutex>
#include <vector>

#include "core/posix.hpp"
#include "handle/files.hpp"
#include "handle/opened.hpp"
#include "nvio/errors.hpp"
#include "nvio/warnings.hpp"

namespace nvio {
namespace detail {

void use_opened(Operation& op, const Opened& opened) {
  op.direct_fd = opened.file->direct_fd;
  op.buffered_fd = opened.file->buffered_fd;
  op.name = opened.file->name;
  op.path = NameRef(*op.name);
  op.file = opened.file;
  check_size(op, opened.size);
}

}  // namespace detail

namespace {

using detail::OpenFile;

bool mode_reads(FileMode mode) { return mode != FileMode::Write; }
bool mode_writes(FileMode mode) { return mode != FileMode::Read; }

int mode_flags(FileMode mode) {
  switch (mode) {
    case FileMode::Read: return O_RDONLY;
    case FileMode::ReadWrite: return O_RDWR;
    case FileMode::Write: return O_WRONLY;
    case FileMode::WriteRead: return O_RDWR;
  }
  return O_RDONLY;
}

// The size now of the file open as `fd` (statx; a block device's from its ioctl).
std::int64_t size_now(int fd, const std::string& path) {
  detail::FileFacts facts;
  if (const int rc = detail::file_facts(fd, facts); rc < 0) {
    throw_io_error(IoOp::Stat, path, 0, 0, -rc);
  }
  if (facts.size < 0) {
    throw_io_error(IoOp::Stat, path, 0, 0, static_cast<int>(-facts.size),
                   "the size of the block device (BLKGETSIZE64)");
  }
  return facts.size;
}

// The O_DIRECT descriptor, reopened through /proc from the buffered one (the same inode, even
// when the name was replaced in between), or none where the file system refuses O_DIRECT.
void open_direct(OpenFile& file, const std::string& path, int flags, DirectIo direct) {
  const std::string proc = "/proc/self/fd/" + std::to_string(file.buffered_fd);
  const int fd = detail::open_file(proc, flags | O_DIRECT);
  if (fd >= 0) {
    file.direct = detail::FileDescriptor(fd);
    file.direct_fd = fd;
    return;
  }
  if (fd != -EINVAL) throw_io_error(IoOp::Open, path, 0, 0, -fd);
  if (direct == DirectIo::On) {
    throw IoError(IoOp::Open, path, 0, 0, EINVAL,
                  "the file system refuses O_DIRECT and direct=on was requested");
  }
  warn(fmt::format("O_DIRECT is not supported for '{}'; using buffered I/O", path), "no-direct");
}

std::shared_ptr<OpenFile> open_opened(const Handle& handle, const std::string& path,
                                      FileMode mode) {
  if (path.empty()) throw InvalidArgument("file path is empty");
  if (const std::size_t nul = path.find('\0'); nul != std::string::npos) {
    throw InvalidArgument(
        fmt::format("file path '{}' holds a NUL byte at position {}", path.substr(0, nul), nul));
  }
  auto file = std::make_shared<OpenFile>();
  file->name = std::make_shared<const std::string>(path);
  const int flags = mode_flags(mode);
  const bool creates = mode == FileMode::Write || mode == FileMode::WriteRead;
  const int fd = detail::open_file(path, flags | (creates ? O_CREAT | O_TRUNC : 0));
  if (fd < 0) throw_io_error(IoOp::Open, path, 0, 0, -fd);
  file->buffered = detail::FileDescriptor(fd);
  file->buffered_fd = fd;
  if (const int rc = detail::file_facts(fd, file->facts); rc < 0) {
    throw_io_error(IoOp::Stat, path, 0, 0, -rc);
  }
  if (file->facts.type == detail::FileType::Directory) {
    throw IsADirectory(IoOp::Open, path, 0, 0, EISDIR, "the path is a directory, not a file");
  }
  if (file->facts.type == detail::FileType::Other) {
    throw InvalidArgument(fmt::format("{}: not a regular file or block device (mode {:o})", path,
                                      file->facts.mode & S_IFMT));
  }
  if (handle.options().direct != DirectIo::Off) {
    open_direct(*file, path, flags, handle.options().direct);
  }
  return file;
}

}  // namespace

FileMode parse_file_mode(std::string_view mode) {
  std::string m;
  for (char c : mode) {
    if (c != 'b') m.push_back(c);
  }
  if (m == "r") return FileMode::Read;
  if (m == "r+") return FileMode::ReadWrite;
  if (m == "w") return FileMode::Write;
  if (m == "w+") return FileMode::WriteRead;
  throw InvalidArgument(
      fmt::format("file mode '{}' is not one of 'r', 'r+', 'w', 'w+'", std::string(mode)));
}

const char* to_string(FileMode mode) noexcept {
  switch (mode) {
    case FileMode::Read: return "r";
    case FileMode::ReadWrite: return "r+";
    case FileMode::Write: return "w";
    case FileMode::WriteRead: return "w+";
  }
  return "?";
}

struct File::State {
  Handle* handle = nullptr;
  std::string path;
  FileMode mode = FileMode::Read;
  mutable std::mutex mutex;
  std::shared_ptr<OpenFile> file;  // null once closed; guarded by mutex
  std::size_t calls = 0;           // calls running now; guarded by mutex
  // The size reads are checked against: from opening, refreshed by a read past it and by size(),
  // grown by the File's own writes.
  std::atomic<std::int64_t> size{0};

  void grow_to(std::int64_t end) {
    std::int64_t now = size.load(std::memory_order_relaxed);
    while (now < end && !size.compare_exchange_weak(now, end, std::memory_order_relaxed)) {
    }
  }

  // One call on the file: holds it open (close() refuses meanwhile) and checks the access.
  class Call {
   public:
    Call(State& s, bool write) : s_(s) {
      std::lock_guard lock(s.mutex);
      if (s.file == nullptr) throw InvalidArgument(fmt::format("{}: the File is closed", s.path));
      if (write ? !mode_writes(s.mode) : !mode_reads(s.mode)) {
        throw InvalidArgument(
            fmt::format("{}: the File was opened with mode '{}', which does not {}", s.path,
                        to_string(s.mode), write ? "write" : "read"));
      }
      file_ = s.file;
      ++s.calls;
    }
    ~Call() {
      std::lock_guard lock(s_.mutex);
      --s_.calls;
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    const std::shared_ptr<OpenFile>& file() const { return file_; }

   private:
    State& s_;
    std::shared_ptr<OpenFile> file_;
  };

  // Runs `extents` on the file (see Handle::run_opened).
  Ticket run(bool write, std::span<const WriteExtent> extents, bool batch,
             const WriteOptions& options, bool async) {
    Call call(*this, write);
    std::uint64_t end = 0;
    for (const WriteExtent& e : extents) {
      if (e.offset <= std::numeric_limits<std::uint64_t>::max() - e.length) {
        end = std::max(end, e.offset + e.length);
      }
    }
    detail::Opened opened{call.file(), size.load(std::memory_order_relaxed)};
    if (!write && end > static_cast<std::uint64_t>(opened.size)) {
      // Past the end known: another writer may have grown the file since (one statx).
      opened.size = size_now(call.file()->any_fd(), path);
      grow_to(opened.size);
    }
    const Ticket t = handle->run_opened(write, extents, batch, opened, options, async);
    if (write && end > 0) {
      if (!batch && options.truncate == Truncate::AtEnd) {
        size.store(static_cast<std::int64_t>(end), std::memory_order_relaxed);
      } else {
        grow_to(static_cast<std::int64_t>(end));
      }
    }
    return t;
  }
};

namespace {

WriteOptions from_read(const ReadOptions& r) {
  WriteOptions w;
  w.memory = r.memory;
  return w;
}

template <class Extent>
std::vector<WriteExtent> as_extents(std::span<const Extent> extents) {
  std::vector<WriteExtent> out(extents.size());
  for (std::size_t i = 0; i < extents.size(); ++i) {
    out[i].buf = extents[i].buf;
    out[i].length = extents[i].length;
    out[i].offset = extents[i].offset;
    out[i].memory = extents[i].memory;
  }
  return out;
}

}  // namespace

File::File() noexcept = default;

File::File(Handle& handle, const std::string& path, std::string_view mode)
    : File(handle, path, parse_file_mode(mode)) {}

File::File(Handle& handle, const std::string& path, FileMode mode)
    : state_(std::make_shared<State>()) {
  state_->handle = &handle;
  state_->path = path;
  state_->mode = mode;
  state_->file = open_opened(handle, path, mode);
  state_->size.store(state_->file->facts.size, std::memory_order_relaxed);
}

File::~File() = default;
File::File(File&& other) noexcept = default;
File& File::operator=(File&& other) noexcept = default;

void File::read(void* buf, std::size_t length, std::uint64_t offset,
                const ReadOptions& read_options) const {
  const WriteExtent e{buf, length, offset, {}};  // on the File's file (run_opened)
  state().run(false, {&e, 1}, false, from_read(read_options), false);
}

void File::write(const void* buf, std::size_t length, std::uint64_t offset,
                 const WriteOptions& write_options) const {
  const WriteExtent e{buf, length, offset, {}};  // on the File's file (run_opened)
  state().run(true, {&e, 1}, false, write_options, false);
}

Ticket File::submit_read(void* buf, std::size_t length, std::uint64_t offset,
                         const ReadOptions& read_options) const {
  const WriteExtent e{buf, length, offset, {}};  // on the File's file (run_opened)
  return state().run(false, {&e, 1}, false, from_read(read_options), true);
}

Ticket File::submit_write(const void* buf, std::size_t length, std::uint64_t offset,
                          const WriteOptions& write_options) const {
  const WriteExtent e{buf, length, offset, {}};  // on the File's file (run_opened)
  return state().run(true, {&e, 1}, false, write_options, true);
}

void File::read_batch(std::span<const FileReadExtent> extents,
                      const ReadOptions& read_options) const {
  state().run(false, as_extents(extents), true, from_read(read_options), false);
}

void File::write_batch(std::span<const FileWriteExtent> extents,
                       const WriteOptions& write_options) const {
  state().run(true, as_extents(extents), true, write_options, false);
}

Ticket File::submit_read_batch(std::span<const FileReadExtent> extents,
                               const ReadOptions& read_options) const {
  return state().run(false, as_extents(extents), true, from_read(read_options), true);
}

Ticket File::submit_write_batch(std::span<const FileWriteExtent> extents,
                                const WriteOptions& write_options) const {
  return state().run(true, as_extents(extents), true, write_options, true);
}

void File::close() {
  if (state_ == nullptr) return;
  std::lock_guard lock(state_->mutex);
  if (state_->file == nullptr) return;
  const std::size_t queued = state_->file->queued_ops.load(std::memory_order_acquire);
  if (state_->calls > 0 || queued > 0) {
    const std::size_t n = std::max(state_->calls, queued);
    throw FileBusy(fmt::format("{}: cannot close the File: {} operation(s) on it are in flight; "
                               "wait for them first",
                               state_->path, n),
                   state_->path, n);
  }
  state_->file.reset();
}

bool File::is_open() const noexcept {
  if (state_ == nullptr) return false;
  std::lock_guard lock(state_->mutex);
  return state_->file != nullptr;
}

std::size_t File::in_flight() const {
  if (state_ == nullptr) return 0;
  std::lock_guard lock(state_->mutex);
  if (state_->file == nullptr) return 0;
  return std::max<std::size_t>(state_->calls,
                               state_->file->queued_ops.load(std::memory_order_acquire));
}

std::uint64_t File::size() const {
  State& s = state();
  const State::Call call(s, !mode_reads(s.mode));
  const std::int64_t now = size_now(call.file()->any_fd(), s.path);
  s.size.store(now, std::memory_order_relaxed);
  return static_cast<std::uint64_t>(now);
}

std::uint32_t File::direct_alignment() const {
  State& s = state();
  const State::Call call(s, !mode_reads(s.mode));
  return call.file()->direct_fd >= 0 ? call.file()->facts.direct_io.offset_align : 0;
}

int File::direct_fd() const {
  State& s = state();
  const State::Call call(s, !mode_reads(s.mode));
  return call.file()->direct_fd;
}

int File::buffered_fd() const {
  State& s = state();
  const State::Call call(s, !mode_reads(s.mode));
  return call.file()->buffered_fd;
}

const std::string& File::path() const { return state().path; }
FileMode File::mode() const { return state().mode; }
Handle& File::handle() const { return *state().handle; }

File::State& File::state() const {
  if (state_ == nullptr) {
    throw InvalidArgument("the File is not open (default-made or moved from)");
  }
  return *state_;
}

}  // namespace nvio
