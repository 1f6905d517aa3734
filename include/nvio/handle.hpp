// The I/O handle: reads and writes (buffer, length) at a file offset, by path or by open fd.
//
// Each request is cut into block_size pieces that intra_op_parallelism workers take from a shared
// queue, each worker keeping up to queue_depth pieces in flight on its own engine instance. Any
// length, file offset and buffer address is accepted: with direct I/O the part of the request that
// is aligned to the file system's direct-I/O offset alignment goes through O_DIRECT (straight from
// the caller's buffer when it is suitably aligned, else through pooled aligned bounce buffers), and
// the unaligned head and tail (each shorter than the alignment) go through a buffered descriptor.
// Every completion is checked: short transfers are resumed, errors raise an IoError with the path,
// offset, length and errno of the failed piece. A small blocking call (64 KiB or less of host
// memory) made while the workers have nothing to do is run by the calling thread instead, on an
// engine of the same kind made for that thread, with the same results, errors and counters: no
// hand-off to a worker and back (environment NVIO_CALLER_DRIVEN=off turns this off).
//
// Writes do not truncate: writing [offset, offset + length) over a longer file leaves the bytes
// outside that range and the file size unchanged, as pwrite does. WriteOptions::truncate asks for
// the file to end exactly where the write ends. A write by path creates the file (mode 0644 less
// the umask) if missing. Reads of bytes past the end of the file raise ShortFile, naming the size.
//
// Thread-safety: all member functions may be called concurrently from several threads. The rule
// for waits on a shared handle: wait() returns only once every asynchronous operation submitted
// through this handle before it was called (by any thread) has finished, including operations
// that another thread's wait is collecting at the same time. Each operation is counted by exactly
// one wait (the one that collected it); a wait raises the first failure among all the operations
// it waited for, so a failure is never hidden from a thread whose own operation was collected by
// another thread's wait. Blocking calls are never counted by wait(). Destroying the handle waits
// for every operation still in flight (their errors are dropped: call wait() to see them).
//
// Cancelling and interrupting: cancel(ticket) stops an asynchronous operation's pieces that have
// not started; the pieces the kernel holds finish, and its wait raises an IoError with ECANCELED.
// A thread's waits can be interrupted by an InterruptCheck (nvio/interrupt.hpp): a blocking call
// then cancels its operations, waits for what the kernel holds and throws Interrupted; a wait for
// tickets throws Interrupted and leaves them outstanding.
//
// fork(): a child process cannot use its parent's worker threads (they do not exist in it). The
// first call in a child on a handle made by its parent starts fresh workers with the same options
// (asynchronous operations of the parent are not visible in the child: its wait() counts only its
// own). Destroying such a handle in the child releases nothing the parent's threads might hold:
// the parent's copy of the handle state is left to the child's exit. The counters of stats() are
// part of that state: a child's counters start at zero and count only its own operations.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "nvio/export.hpp"
#include "nvio/gpu.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

namespace detail {
struct NVIO_LOCAL Opened;  // handle/opened.hpp
}  // namespace detail
class File;

enum class Truncate { No, AtEnd };     // AtEnd: the file size becomes offset + length
enum class Durability { None, Data };  // Data: fdatasync before the operation completes

// `memory` says where the buffer lives. Device buffers (CUDA device memory) move through a
// pipeline of locked host bounce chunks and asynchronous copies on a CUDA stream per worker, or
// through cuFile (GPUDirect Storage) as Options::gpu_direct decides; see gpu.hpp. Auto asks CUDA
// when the process has already loaded it, and means Host otherwise.
struct ReadOptions {
  MemoryKind memory = MemoryKind::Auto;
};

struct WriteOptions {
  Truncate truncate = Truncate::No;
  Durability durability = Durability::None;
  MemoryKind memory = MemoryKind::Auto;
};

// Identifies one asynchronous operation (or batch) of one handle. 0 is never a valid ticket.
using Ticket = std::uint64_t;

// A finished asynchronous operation, as wait_some or wait_completion collect it: its failure, or
// null, and when it finished (its last extent done, a write batch's files synced), which may be
// well before the wait that collected it woke: per-operation timings stay honest when several are
// waited for in turn.
struct Completion {
  Ticket ticket = 0;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point finished;
};

// The file of a request or of a batch's extent: a path, or an open descriptor (which nvio does
// not close), exactly one. Converts from either, so that an extent reads {buf, length, offset,
// "/nvme/x.bin"} or {buf, length, offset, fd}. A default one names no file: an extent without a
// file is refused (InvalidArgument). A value: copies own their path.
class FileRef {
 public:
  enum class Kind : std::uint8_t { None, Path, Fd, Opened };

  FileRef() noexcept = default;
  FileRef(std::string path) noexcept  // NOLINT(google-explicit-constructor)
      : kind_(Kind::Path), path_(std::move(path)) {}
  FileRef(const char* path)  // NOLINT(google-explicit-constructor)
      : FileRef(std::string(path)) {}
  FileRef(int fd) noexcept : kind_(Kind::Fd), fd_(fd) {}  // NOLINT(google-explicit-constructor)

  Kind kind() const noexcept { return kind_; }
  bool is_path() const noexcept { return kind_ == Kind::Path; }
  bool is_fd() const noexcept { return kind_ == Kind::Fd; }
  // The path (empty unless is_path()) and the descriptor (-1 unless is_fd()).
  const std::string& path() const noexcept { return borrowed_ != nullptr ? *borrowed_ : path_; }
  int fd() const noexcept { return fd_; }
  // Kind::Opened, inside the library only: an nvio::File's open file.
  const detail::Opened* opened() const noexcept { return opened_; }

 private:
  friend class Handle;
  // A path the caller keeps alive for as long as the reference is used (a call by path: no copy
  // of the name per operation).
  static FileRef borrow(const std::string& path) noexcept {
    FileRef f;
    f.kind_ = Kind::Path;
    f.borrowed_ = &path;
    return f;
  }
  static FileRef of(const detail::Opened& opened) noexcept {
    FileRef f;
    f.kind_ = Kind::Opened;
    f.opened_ = &opened;
    return f;
  }

  Kind kind_ = Kind::None;
  int fd_ = -1;
  std::string path_;
  const std::string* borrowed_ = nullptr;
  const detail::Opened* opened_ = nullptr;
};

// One extent of a batch: `length` bytes of `buf` at `offset` of `file`. `memory` says where this
// extent's buffer lives; Auto takes the batch's (ReadOptions / WriteOptions::memory, which is
// itself asked of CUDA per buffer when Auto). A batch may mix host and device extents: the handle
// moves each by its own kind's transport.
struct ReadExtent {
  void* buf = nullptr;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  FileRef file;
  MemoryKind memory = MemoryKind::Auto;
};
struct WriteExtent {
  const void* buf = nullptr;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  FileRef file;
  MemoryKind memory = MemoryKind::Auto;
};

// What a handle has done since it was made, as Handle::stats() reads it. Host memory moves as
// direct pieces (zero-copy, or through bounce buffers when the caller's buffer is not aligned for
// O_DIRECT), buffered edges, or buffered pieces when direct I/O is off or not supported; device
// memory through cuFile or host bounce chunks (see the fields below).
//
// A difference of two snapshots (after - before) gives what happened between them, which is how
// a caller measures one phase; there is no reset, so that one reader's measurement never disturbs
// another's and a reset could not tear against operations in flight.
struct HandleStats {
  // Operations that succeeded (each extent of a batch counts as one), and their lengths. A failed
  // operation counts in `errors` only, and so does a call refused before anything started (a bad
  // argument, a file that cannot be opened, a read found to go past the end of the file): once,
  // a refused batch too.
  std::uint64_t reads = 0;
  std::uint64_t writes = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  // Pieces whose transfer completed (a request is cut into block_size pieces plus, with direct
  // I/O, its unaligned head and tail); a piece resumed after short transfers counts once.
  std::uint64_t pieces = 0;
  // Requests offered to the engine again without a byte moving: after an EINTR or EAGAIN
  // completion (or an EAGAIN from submission with nothing in flight), or after a short direct
  // transfer that made no aligned progress.
  std::uint64_t retries = 0;
  // Completions that moved some bytes but fewer than asked; the piece resumed where it stopped.
  std::uint64_t short_transfers = 0;
  // Host memory: bytes of direct pieces moved through aligned bounce buffers.
  std::uint64_t bounced_bytes = 0;
  // Bytes of the unaligned heads and tails that went through the buffered descriptor while the
  // rest of their request used direct I/O (host or device memory).
  std::uint64_t edge_bytes = 0;
  // Device memory: bytes moved through cuFile (GPUDirect Storage), and through locked host bounce
  // chunks and device copies.
  std::uint64_t gds_bytes = 0;
  std::uint64_t device_bounce_bytes = 0;
  // Host memory: bytes of direct pieces of a read whose memory was not aligned for O_DIRECT that
  // were read into the caller's buffer a few bytes past their place and then moved there, instead
  // of through bounce buffers (a read of several pieces; see docs/design.md).
  std::uint64_t shifted_bytes = 0;
  // Host memory: bytes of reads planned direct that were found in the page cache when planned and
  // read through it instead (option cached_reads; a request partly cached counts its cached
  // pieces).
  std::uint64_t cached_bytes = 0;
  // Failed operations by the errno of their error (IoError::error_code, MemoryError's; 0 for a
  // failure without one, e.g. a file that shrank during a read, or a CUDA error). Only errnos seen
  // are present. An errno above 255 (Linux has none) counts under 255.
  std::map<int, std::uint64_t> errors;

  // Field by field; an errno whose count becomes 0 is dropped.
  HandleStats& operator-=(const HandleStats& before);
  friend HandleStats operator-(HandleStats after, const HandleStats& before) {
    return after -= before;
  }
  // Field by field: the counters of several handles together (a striped file's drives).
  HandleStats& operator+=(const HandleStats& other);
  friend HandleStats operator+(HandleStats a, const HandleStats& b) { return a += b; }
  bool operator==(const HandleStats&) const = default;
};

// The counters of HandleStats (all but `errors`) by name, with a description, in declaration
// order: what the Python binding and `nvio bench --json` print.
struct HandleStatsField {
  const char* name;
  std::uint64_t HandleStats::*member;
  const char* description;
};
std::span<const HandleStatsField> handle_stats_fields() noexcept;

class Handle {
 public:
  // Uses resolve_options(): defaults overridden by NVIO_* environment variables.
  Handle();
  // Validates `options` (InvalidArgument naming the option) and starts the workers. Throws
  // EngineUnavailable when an explicitly named engine cannot be used here.
  explicit Handle(const Options& options);
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&&) = delete;
  Handle& operator=(Handle&&) = delete;

  // Blocking operations: return when every byte is transferred, or throw.
  void read(void* buf, std::size_t length, const std::string& path, std::uint64_t offset = 0,
            const ReadOptions& read_options = {});
  void write(const void* buf, std::size_t length, const std::string& path, std::uint64_t offset = 0,
             const WriteOptions& write_options = {});
  // By an already open descriptor; nvio does not close it. The descriptor must stay open until
  // the operation completes.
  void read(void* buf, std::size_t length, int fd, std::uint64_t offset = 0,
            const ReadOptions& read_options = {});
  void write(const void* buf, std::size_t length, int fd, std::uint64_t offset = 0,
             const WriteOptions& write_options = {});

  // Asynchronous operations: argument errors and failures to open the file throw here; I/O
  // errors are raised by the wait that collects the ticket. The buffer must stay valid until then.
  Ticket submit_read(void* buf, std::size_t length, const std::string& path,
                     std::uint64_t offset = 0, const ReadOptions& read_options = {});
  Ticket submit_write(const void* buf, std::size_t length, const std::string& path,
                      std::uint64_t offset = 0, const WriteOptions& write_options = {});
  Ticket submit_read(void* buf, std::size_t length, int fd, std::uint64_t offset = 0,
                     const ReadOptions& read_options = {});
  Ticket submit_write(const void* buf, std::size_t length, int fd, std::uint64_t offset = 0,
                      const WriteOptions& write_options = {});

  // Batches: many extents, of one file or of several, as one operation with one ticket. Every
  // extent is prepared (checked, its file opened once per batch, a read's size checked) before
  // any of them starts, so an argument error starts nothing. The extents of one file share its
  // descriptors; a write batch with Durability::Data syncs each file once, after its last extent.
  // Truncate::AtEnd is refused. A wait raises the first failure in extent order, after every
  // extent has finished. Extents should not overlap (a write batch's overlapping extents land in
  // no defined order).
  void read_batch(std::span<const ReadExtent> extents, const ReadOptions& read_options = {});
  void write_batch(std::span<const WriteExtent> extents, const WriteOptions& write_options = {});
  Ticket submit_read_batch(std::span<const ReadExtent> extents,
                           const ReadOptions& read_options = {});
  Ticket submit_write_batch(std::span<const WriteExtent> extents,
                            const WriteOptions& write_options = {});

  // Waits for one ticket; throws its error. A ticket can be waited on once (InvalidArgument after).
  void wait(Ticket ticket);
  // Waits for one ticket like wait(ticket), but returns its Completion instead of throwing its
  // failure (an unknown ticket still throws InvalidArgument).
  Completion wait_completion(Ticket ticket);
  // True when the operation has finished (successfully or not); does not collect it.
  bool done(Ticket ticket) const;
  // Waits for every outstanding asynchronous operation and returns how many completed (0 when
  // none). If any failed, all are still waited for, then the first failure is thrown.
  std::size_t wait();
  // Completions in bulk, in the order the operations finished: waits until at least `min_count`
  // of the outstanding asynchronous operations have finished (or until none that could is left:
  // fewer when fewer are outstanding), collects those finished, at most out.size(), into `out`
  // and returns how many. Failures are not thrown: each is in its Completion. A collected ticket
  // is gone, as after wait(ticket). min_count 0 collects what has finished without waiting.
  std::size_t wait_some(std::span<Completion> out, std::size_t min_count = 1);
  // Operations submitted and not yet collected by a wait.
  std::size_t pending() const;
  // Whether `ticket` was submitted and no wait has taken it (a wait takes a ticket when it starts
  // waiting for it: false while another thread's wait is on it). After a wait for it threw, false
  // means that the wait collected it (it failed), true that the wait was interrupted and the
  // ticket is outstanding again.
  bool is_pending(Ticket ticket) const;
  // Cancels what has not started of the operations of `ticket`: their pieces that no worker has
  // taken are skipped; those the kernel holds finish. Returns true when some operation was cut
  // short: the wait that collects the ticket then raises an IoError with ECANCELED (the bytes of a
  // read or write cancelled are partly moved). False when every piece had started already (or the
  // submitting thread is still queueing them): the ticket completes as it would have. A ticket
  // another thread is waiting for can be cancelled; an unknown or collected one throws
  // InvalidArgument. Does not wait.
  bool cancel(Ticket ticket);

  // The handle keeps the files it opened (at most 64 names per access mode), so that the next
  // operation on the same name costs one statx instead of two opens, a statx and two closes; a
  // caller's descriptor reopened for the access it lacks (O_DIRECT, or buffered for unaligned
  // edges) is kept likewise. A name that now refers to another file (replaced, removed) is opened
  // afresh. While kept, a removed file keeps its disk space and a file written keeps its file
  // system's block preallocation (ext4), as any open descriptor does: close_files() lets go of
  // every kept file (operations in flight finish with theirs). open_files() counts them.
  void close_files();
  // Lets go of what the handle keeps of one file: the file open as the caller's descriptor `fd`
  // (kept by name or as that descriptor), or the file `path` names now and whatever is kept under
  // that name. For a caller about to remove a file it wrote through the handle (a failed save's
  // temporary file), whose disk space would otherwise stay taken until the handle let go of it by
  // itself (within a second). Operations in flight keep theirs; a file not kept is no error.
  // Thread-safe.
  void close_file(int fd);
  void close_file(const std::string& path);
  std::size_t open_files() const;

  // The counters of everything this handle has done (see HandleStats). Cheap: each worker
  // counts into its own cache line with relaxed atomics, and this sums them. Each counter is
  // exact once the operations it covers have finished (a blocking call returned, or a wait
  // collected them); read while operations run, the snapshot is not atomic across counters (an
  // operation counts once its last piece has, so `pieces` may include pieces of operations that
  // `reads` does not count yet). Thread-safe.
  HandleStats stats() const;

  const Options& options() const noexcept;
  // The engine in use (never Auto) and why it was chosen.
  EngineKind engine() const noexcept;
  const std::string& engine_reason() const noexcept;

 private:
  friend class File;
  // nvio::File's operations (file.hpp): `extents` of the file `opened` (their `file` is
  // not used), as one operation (`batch` false: one extent) or a batch; blocking (returns 0) or
  // asynchronous (returns the ticket).
  NVIO_LOCAL Ticket run_opened(bool write, std::span<const WriteExtent> extents, bool batch,
                               const detail::Opened& opened, const WriteOptions& options,
                               bool async);

  struct NVIO_LOCAL Impl;
  // The state for this process: after a fork(), a fresh one is made in the child (see above).
  // Mutable: a const call in a forked child also needs the child's own state.
  NVIO_LOCAL Impl& impl() const;
  NVIO_LOCAL Impl& renew_after_fork() const;
  mutable std::unique_ptr<Impl> impl_;
  mutable std::atomic<pid_t> owner_pid_;  // the process whose worker threads serve impl_
};

}  // namespace nvio
NVIO_API_END
