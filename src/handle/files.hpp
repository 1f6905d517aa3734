// Opening the file of an operation, and the files a handle keeps open between operations.
// Internal to the library.
//
// Opening is most of what a small operation costs: by path, two opens (O_DIRECT and buffered),
// a statx and two closes; by a caller's descriptor, a reopen through /proc for the access it
// lacks. A handle therefore keeps the files it opened (FileCache): the next operation on the same
// name costs one statx of the name, which also tells whether the name still refers to the same
// file (device and inode). A file replaced or removed under its name is opened afresh; a caller's
// descriptor number reused for another file likewise (its statx is made anyway, for the size).
//
// The price of keeping files open: a file removed while the handle holds it keeps its disk space
// until the handle lets it go, and ext4 keeps a written file's block preallocation. So the handle
// lets go of a file soon: a file unused for kIdle (one second) is closed by an idle worker, a
// removed one (no links left) is closed within kIdle while the handle is busy, before the handle
// opens a file for writing (whose blocks the removed one may hold: "delete the old checkpoint,
// then save"), and in every handle of the process when a write runs out of space (the write is
// then tried once more: release_removed_files); Handle::close_files() closes all at once. At most
// capacity() files are kept per table.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "handle/operation.hpp"
#include "nvio/options.hpp"

namespace nvio::detail {

// "fd N (target)", for messages about a caller's descriptor.
std::string fd_name(int fd);

// What allocate_past_end did.
enum class Allocated { Nothing, Range, Refused, Unsupported };

// A direct write of [offset, end) to the file open as `fd` (of type `type`, `size` bytes when the
// write was prepared) that ends past the end first allocates the range past the end with
// fallocate. ext4 serialises extending O_DIRECT writes (it takes the inode lock exclusively and
// completes them synchronously: libaio's io_submit blocks in each, io_uring hands each to a worker
// thread), so a new file written in pieces had about one piece in flight: 1 GiB written into a new
// file took 1.09 s, into one allocated first 0.65 s (bench/results.md, "Writes into new files").
// fallocate (mode 0) extends the size but never shrinks it, so another writer's bytes past this
// write's end are safe (ftruncate could cut them off, and a size found stale only makes the range
// larger), and it allocates only from max(size, offset): a hole before the write stays a hole.
// Regular files only. An optimisation only: a refusal (Refused: ENOSPC on a nearly full file
// system, EBADF...; Unsupported: EOPNOTSUPP or ENOSYS, worth remembering per file) leaves the
// extending writes as before, which report their own errors. Nothing when the write ends inside
// the file. Thread-safe (one system call).
Allocated allocate_past_end(int fd, FileType type, std::int64_t size, std::uint64_t offset,
                            std::uint64_t end) noexcept;

// Records `size` as op.checked_size. A read past the end of the file (or block device) is refused
// up front, naming the size (or the errno of the ioctl that should have given a block device's
// size, when `size` is negative).
void check_size(Operation& op, std::int64_t size);

// Uses the descriptors `first` (an earlier extent of the same batch) opened for the same file.
void share_file(Operation& op, const Operation& first);

// The open files of one handle, by name and access mode, and the reopened descriptors of callers'
// descriptors. Thread-safe: one mutex guards the tables; opening and statx run outside it. An
// entry is shared (shared_ptr) with the operations using it, so eviction never closes a
// descriptor an operation in flight uses.
class FileCache {
 public:
  static constexpr std::size_t kCapacity = 64;  // per table
  // The most files one table keeps now: kCapacity, fewer where the process may open few
  // descriptors, so that the files kept (two descriptors each, three tables) hold at most an
  // eighth of RLIMIT_NOFILE: the application's own opens must not find its descriptors taken by
  // this cache. Read at each new file kept, so that a limit lowered later counts.
  static std::size_t capacity() noexcept;
  static constexpr std::chrono::milliseconds kIdle{1000};

  // Each cache is listed process-wide for release_removed_files while it exists.
  explicit FileCache(DirectIo direct);
  ~FileCache();
  FileCache(const FileCache&) = delete;
  FileCache& operator=(const FileCache&) = delete;

  // Opens `op`'s file by name (op.path, op.direction), or reuses the open one that the name still
  // refers to; sets op.file, op.direct_fd and op.buffered_fd and checks a read's size. Throws
  // IoError (open, stat), IsADirectory, InvalidArgument (not a file), ShortFile.
  void open_path(Operation& op);
  // The same for a caller's descriptor `fd`, used as it is for the access it has; a second
  // descriptor to the same file (through /proc/self/fd) is opened, once, for the access it lacks
  // (O_DIRECT, or buffered for unaligned edges) and kept while `fd` refers to the same file.
  void adopt_fd(Operation& op, int fd);
  // Lets go of every file kept (operations in flight keep theirs until they finish).
  void clear();
  // Lets go of the entries of the file open as `fd` (any table), or of the file `path` names now
  // and of the entries kept under that name.
  void clear_file(int fd);
  void clear_file(const std::string& path);
  // Lets go of the files unused for kIdle and of the removed ones. Returns whether any is still
  // kept (then it wants to be called again after another kIdle).
  bool release_unused();
  // Lets go of the removed files (no name left); returns how many entries it dropped.
  std::size_t release_removed();
  // Files kept now (both tables), for tests.
  std::size_t size() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::shared_ptr<OpenFile> file;
    Clock::time_point last_used;
  };
  using Table = std::unordered_map<std::string, Entry>;

  // Drops the entries of every table for which `drop` is true; returns how many. Called with
  // mutex_ held.
  template <class Drop>
  std::size_t drop_if(Drop drop);

  std::shared_ptr<OpenFile> find(Table& table, const std::string& key);
  // open_file(); when the process is out of descriptors (EMFILE, ENFILE), lets go of every file
  // kept (those operations in flight use close when they finish) and tries once more, so that a
  // small RLIMIT_NOFILE costs the cache, not the operation.
  int open_shedding(const std::string& path, int flags);
  void keep(Table& table, const std::string& key, std::shared_ptr<OpenFile> file);
  std::shared_ptr<OpenFile> open_new(Operation& op);

  const DirectIo direct_;
  mutable std::mutex mutex_;
  Table read_paths_;   // by name, opened for reading
  Table write_paths_;  // by name, opened for writing
  // By caller descriptor, its access mode and whether it has O_DIRECT: the second descriptor.
  Table adopted_;
  Clock::time_point last_sweep_ = Clock::now();  // of removed files, while busy
};

// Lets go of the removed files every FileCache of the process keeps (each handle's), for a write
// that ran out of space: a file removed while a handle kept it open holds its blocks until
// closed, so the disk stays full. Returns removed_files_released() after it. Thread-safe; a
// worker calls it.
std::uint64_t release_removed_files() noexcept;
// How many calls of release_removed_files let go of some file, in this process so far. A write
// that ran out of space is worth trying again when this changed since it was submitted: its
// pieces in flight fail together, and only the first one's call finds files to let go of.
std::uint64_t removed_files_released() noexcept;

}  // namespace nvio::detail
