// One read or write request inside the handle, and the queue its pieces wait in for the workers.
// Internal to the library.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/interrupt.hpp"
#include "core/posix.hpp"
#include "cuda/device_ops.hpp"
#include "cuda/transport.hpp"
#include "engine/engine.hpp"
#include "handle/plan.hpp"
#include "handle/residency.hpp"
#include "handle/stats.hpp"
#include "nvio/errors.hpp"
#include "nvio/handle.hpp"

namespace nvio::detail {

// The name of an operation's file, for messages: a pointer to a string that outlives every use
// of it (the caller's path while the operation is prepared, then its OpenFile's name, which
// Operation::name keeps), not a copy, which would cost a heap allocation per operation for any
// path longer than std::string's inline buffer. Converts to const std::string& and formats as the
// string.
class NameRef {
 public:
  NameRef() noexcept : s_(&empty()) {}
  explicit NameRef(const std::string& s) noexcept : s_(&s) {}
  operator const std::string&() const noexcept {
    return *s_;
  }  // NOLINT(google-explicit-constructor)
  const std::string& str() const noexcept { return *s_; }
  bool empty_name() const noexcept { return s_->empty(); }

 private:
  static const std::string& empty() noexcept {
    static const std::string none;
    return none;
  }
  const std::string* s_;
};

// The exception_ptr of throw_io_error(...): made where an error is recorded for later.
std::exception_ptr io_error_ptr(IoOp op, const std::string& path, std::uint64_t offset,
                                std::uint64_t length, int err, const std::string& detail = {});

// The descriptors opened for a file, and what one statx found about it when they were opened.
// Shared by the operations using it and by the handle's FileCache (handle/files.hpp), and closed
// when the last of them lets go. Immutable once made, but for the device-direct engine's
// registration, made once on demand (registration(), thread-safe).
struct OpenFile {
  // The path, or "fd N (target)", for messages; shared with the operations using the file, which
  // keep it after they let go of the descriptors.
  std::shared_ptr<const std::string> name;
  FileDescriptor direct;
  FileDescriptor buffered;
  int direct_fd = -1;    // as opened or adopted, before planning: -1 without direct I/O
  int buffered_fd = -1;  // -1 when none could be had
  FileFacts facts;       // as the file was when it was opened (its size may have changed since)

  int any_fd() const { return buffered_fd >= 0 ? buffered_fd : direct_fd; }

  // Operations of the handle queued on this file and not finished yet (Handle::Impl::queue_job):
  // a direct write past the end allocates its range only when none is, since fallocate waits for
  // the file's direct I/O in flight and would block the submitting thread meanwhile.
  std::atomic<std::uint32_t> queued_ops{0};
  // The file system refused fallocate once (EOPNOTSUPP, ENOSYS): not asked again.
  std::atomic<bool> no_fallocate{false};

  // The device-direct engine's registration of `direct` (engine::register_file), made by `make`
  // for the first operation that asks and kept as long as the file is: registering is a call into
  // a driver per file, not per operation. A refusal is kept too and thrown again to every later
  // caller without asking again (cuFile: each refusal costs the driver call and a line in its
  // log). Thread-safe: `make` runs once, whichever threads ask.
  std::shared_ptr<const engine::FileRegistration> registration(
      const std::function<std::shared_ptr<const engine::FileRegistration>()>& make) const;

 private:
  // After the descriptors: the registration goes before they close.
  mutable std::once_flag registration_once_;
  mutable std::shared_ptr<const engine::FileRegistration> registration_;
  mutable std::exception_ptr registration_error_;
};

// The finishing steps of a batch of writes, run once by whichever of its operations finishes
// last: one fdatasync per file instead of one per extent. Thread-safe (atomics; `files` is read
// by the last operation only).
struct BatchFinish {
  std::atomic<std::size_t> left{0};  // operations not finished yet
  std::atomic<bool> failed{false};   // some operation failed: nothing is synced
  Durability durability = Durability::None;
  std::vector<std::shared_ptr<OpenFile>> files;  // distinct files, kept open until synced
};

struct Operation;

// The landing of a read of host memory whose direct middle is not aligned in the caller's buffer
// (file offset and address disagree modulo the kernel's memory alignment) and has several pieces
// (plan_shifted, handle/plan.hpp): each middle piece is read straight into the caller's buffer,
// `shift` bytes past its place where the address is aligned, the tail into a small buffer of the
// operation's own, and then each is moved to its place. A piece's move overwrites the last
// `shift` bytes where the piece before it landed, so the moves go in file order: a piece that
// lands before its predecessor has moved waits (its slot is free meanwhile: the kernel is done
// with it), and whichever worker moves a piece also moves the landed ones after it. Each byte is
// moved once at memmove speed, against a checked copy (memory/user_copy.hpp) and a chunk of the
// worker's pool for a bounced piece; the kernel checks that the buffer is writable (EFAULT).
//
// The members are the middle's pieces in file order, then the tail edge. Each member is counted
// as finished exactly once: by the thread that moves it, or, once the operation has failed (no
// more moves: the buffer's contents no longer matter), by its landing or by abandon().
// Thread-safe (its mutex); owned by its Operation.
class ShiftedRead {
 public:
  // `tail_align`: the alignment of the tail's buffer (a direct tail is read into it), a power
  // of two.
  ShiftedRead(std::size_t shift, std::size_t members, std::size_t tail_length,
              std::size_t tail_align);
  std::size_t shift() const noexcept { return shift_; }
  std::byte* tail() const noexcept { return tail_.get(); }
  // The member whose piece starts at `file_offset` (at or after the plan's head_end).
  static std::size_t member(const Plan& plan, std::uint64_t file_offset) noexcept;
  // Member `k` of `op` has landed; moves it and the landed members after it when it is the next
  // to move. Returns how many members the caller must now count as finished (finish_piece).
  std::size_t landed(const Operation& op, std::size_t k);
  // `op` failed: the members landed and not yet moved will never be. Returns how many, for the
  // caller to count as finished; members landing later count themselves (landed() returns 1).
  std::size_t abandon();

 private:
  enum class State : std::uint8_t { Pending, Landed, Moving, Done };
  void move(const Operation& op, std::size_t k) const noexcept;
  std::size_t collect_landed();  // mutex_ held

  struct AlignedDelete {
    std::align_val_t align;
    void operator()(std::byte* p) const noexcept;
  };
  const std::size_t shift_;
  // Aligned for O_DIRECT: a direct tail (Plan::tail_direct) is read into it.
  const std::unique_ptr<std::byte[], AlignedDelete> tail_;
  std::mutex mutex_;
  std::vector<State> states_;  // guarded by mutex_, as are the two below
  std::size_t next_ = 0;       // the first member not moved yet
  bool abandoned_ = false;
};

// Told when an operation finishes, for the handle's wait_some, on the thread that finished it (a
// worker, or a submitter whose operation never started); neither call may throw or block for long.
// operation_finished comes after the finishing steps and before `finished` is set (a wait that
// sees `finished` may free what the listener uses to record it); it returns true when the
// operation's job is now complete. wake_collectors comes after `finished` is set, only then: a
// collector woken earlier would find the job listed but its operation not yet marked finished, and
// would spin for it while the finishing thread, on a busy CPU, may not run.
class FinishListener {
 public:
  virtual bool operation_finished(const Operation& op) noexcept = 0;
  virtual void wake_collectors() noexcept = 0;

 protected:
  ~FinishListener() = default;
};

// An operation's lifecycle, one named state instead of separate flags. The transitions, made by
// Operation::advance and checked there against lifecycle_allows (nothing else writes the state):
//
//   Prepared ──push()──► Queued ──an error recorded──► Failed
//      │                   │                             │
//      └─ never queued ────┴────── its last piece ───────┴──► Finishing ──outcome final──► Finished
//
//   Prepared   made by its submitting thread; no worker has seen it. An error recorded now (a
//              push() refused: a worker died, no memory) keeps the state: no piece was taken.
//   Queued     in the queue (push(), under the queue's mutex): workers take its pieces. It counts
//              in its file's queued_ops from queue_job until it leaves for Finishing.
//   Failed     an error was recorded while pieces were out: none starts any more, and those in
//              flight finish (the kernel may still hold them).
//   Finishing  its last piece finished (or it had none, or was never queued): the one thread that
//              finished it runs the finishing steps (a write's truncate and fdatasync, a batch's
//              sync; an error there is recorded, the state stays) and counts the outcome.
//   Finished   the outcome is final: waiters return, and may drop the operation.
enum class Lifecycle : std::uint8_t { Prepared, Queued, Failed, Finishing, Finished };

constexpr bool lifecycle_allows(Lifecycle from, Lifecycle to) noexcept {
  switch (to) {
    case Lifecycle::Prepared: return false;
    case Lifecycle::Queued: return from == Lifecycle::Prepared;
    case Lifecycle::Failed: return from == Lifecycle::Queued;
    case Lifecycle::Finishing:
      return from == Lifecycle::Prepared || from == Lifecycle::Queued || from == Lifecycle::Failed;
    case Lifecycle::Finished: return from == Lifecycle::Finishing;
  }
  return false;
}

// One read or write request. The submitting thread fills in everything above `next_piece` before
// the operation is queued; afterwards those fields are read-only. `next_piece` is guarded by the
// queue's mutex; `error` and finished_at by `mutex`; `state` is atomic (see Lifecycle).
struct Operation {
  engine::Direction direction = engine::Direction::Read;
  NameRef path;                             // for messages: the file name, or "fd N (name)"
  std::shared_ptr<OpenFile> file;           // its file's descriptors (a caller's fd is not owned)
  std::shared_ptr<const std::string> name;  // its file's name, which `path` points into
  std::int64_t checked_size = 0;            // the file's size when the operation was prepared
  std::shared_ptr<BatchFinish> batch;       // set for the operations of a batch of writes
  int direct_fd = -1;                       // -1: no direct I/O for this operation
  int buffered_fd = -1;
  std::byte* buf = nullptr;
  std::uint64_t offset = 0;
  std::size_t length = 0;
  WriteOptions write_options;
  MemoryKind memory = MemoryKind::Host;  // resolved: never Auto
  int device = -1;                       // device memory: its CUDA device ordinal
  cuda::Transport transport = cuda::Transport::Bounce;
  std::shared_ptr<cuda::DeviceOps> device_ops;  // device memory: the operations to use
  // direct_fd as that engine needs it prepared (engine::register_file): the file's own
  // registration, or this operation's; null when it needs none.
  std::shared_ptr<const engine::FileRegistration> registration;
  // Direct I/O: the kernel's alignment of file offsets and lengths, and of buffer addresses.
  std::uint32_t dio_offset_align = 1;
  std::uint32_t mem_align = 1;
  Plan plan;
  std::size_t piece_count = 0;
  std::unique_ptr<ShiftedRead> shifted;  // set when the read's middle lands shifted
  CachedRanges cached;                   // a read's pieces found in the page cache (residency.hpp)
  // Asynchronous operations: told when this one finishes, with `job` (the listener's own record
  // of the ticket it belongs to, which outlives the call).
  FinishListener* listener = nullptr;
  void* job = nullptr;

  std::size_t next_piece = 0;

  std::atomic<std::size_t> remaining{0};  // pieces not yet finished (or skipped)
  // Written by advance() only (see Lifecycle); Finished is stored under `mutex`, so that a waiter
  // on finished_cv never misses it.
  std::atomic<Lifecycle> state{Lifecycle::Prepared};
  std::mutex mutex;
  std::condition_variable finished_cv;
  // When the outcome became final (after the finishing steps), for Completion::finished.
  std::chrono::steady_clock::time_point finished_at;
  std::exception_ptr error;

  std::uint64_t end() const { return offset + length; }
  bool is_read() const { return direction == engine::Direction::Read; }
  // The caller's memory of the piece that starts at file offset `at`.
  std::byte* user(std::uint64_t at) const { return buf + (at - offset); }
  // Piece `index` of the plan, through the buffered descriptor where it was found cached.
  Piece piece(std::size_t index) const {
    Piece p = plan.piece(index);
    if (p.direct && cached.holds(plan, p.file_offset)) p.direct = false;
    return p;
  }
  // Whether the piece at `file_offset` is a member of a shifted read (its middle or its tail).
  bool lands_shifted(std::uint64_t file_offset) const {
    return shifted != nullptr && file_offset >= plan.head_end;
  }
  // Where piece `p`'s transfer reads or writes memory: its place in the caller's buffer, or for a
  // shifted read's members, where they land (see ShiftedRead).
  std::byte* landing(const Piece& p) const {
    if (!lands_shifted(p.file_offset)) return user(p.file_offset);
    if (p.file_offset >= plan.tail_begin) return shifted->tail();
    return user(p.file_offset) + shifted->shift();
  }
  // Whether its pieces go to engine::kDeviceDirectEngine (device memory on the direct
  // transport) rather than to the handle's engine.
  bool device_direct() const noexcept { return transport == cuda::Transport::Gds; }
  // Whether piece `p` moves through a bounce chunk: device memory on the bounce transport, and
  // direct pieces whose memory is not aligned for O_DIRECT.
  bool needs_bounce(const Piece& p) const {
    if (memory == MemoryKind::Device) return transport == cuda::Transport::Bounce;
    return p.direct && reinterpret_cast<std::uintptr_t>(landing(p)) % mem_align != 0;
  }
  // The descriptor to use for a read's size check after it found end of file.
  int any_fd() const { return buffered_fd >= 0 ? buffered_fd : direct_fd; }
  // Moves the state to `to` when lifecycle_allows it from the state now: true. False, moving
  // nothing, otherwise; `was` receives the state found. Thread-safe.
  bool advance(Lifecycle to, Lifecycle* was = nullptr) noexcept {
    Lifecycle from = state.load(std::memory_order_acquire);
    while (lifecycle_allows(from, to)) {
      if (state.compare_exchange_weak(from, to, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        if (was != nullptr) *was = from;
        return true;
      }
    }
    if (was != nullptr) *was = from;
    return false;
  }
  // Failed: an error was recorded while its pieces were out; nothing new of it starts.
  bool failed() const noexcept {
    return state.load(std::memory_order_acquire) == Lifecycle::Failed;
  }
  bool finished() const noexcept {
    return state.load(std::memory_order_acquire) == Lifecycle::Finished;
  }
  // Keeps the first error; a queued operation becomes Failed. Thread-safe.
  void record_error(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!error) error = std::move(e);
    advance(Lifecycle::Failed);
  }
  bool has_error() {
    std::lock_guard lock(mutex);
    return error != nullptr;
  }
};

using OperationPtr = std::shared_ptr<Operation>;

// The error of a read of `op` that got end of file at byte `at` of the file: the file ended
// inside the request while it was being read.
std::exception_ptr ended_during_read(const Operation& op, std::uint64_t at);

// Whether `op`'s file now ends before byte `end` (one fstat): a file cut after it was opened (a
// File keeps the size it had then) can end a direct read at an unaligned size.
bool file_now_ends_before(const Operation& op, std::uint64_t end);

// The handle's queue of operations, shared by the submitting threads and the workers: pieces are
// taken from the operation at its head, and an operation finishes when all its pieces have. The
// thread that finishes it counts its outcome into `stats`, that thread's shard of the handle's
// counters (handle/stats.hpp).
// Thread-safe: one mutex guards the queue, `stopping`, the dead worker's error and every
// operation's `next_piece`; another counts the operations alive.
class OperationQueue {
 public:
  // Queues `op` (or finishes it at once when it has no pieces or cannot be queued).
  void push(const OperationPtr& op, StatsShard& stats);
  // Takes the next piece of the operation at the head of the queue into `op` and `piece`.
  // Returns false when there is none (after waiting for one when `wait_for_work`, until stop()),
  // when the next one needs a bounce chunk and `bounce_ok` is false, or when `op` is the head
  // and `taken_from_op` reached `per_op_limit` (a share is left to the other workers).
  bool take_piece(OperationPtr& op, Piece& piece, bool bounce_ok, bool wait_for_work,
                  std::size_t per_op_limit, std::size_t taken_from_op);
  // `count` pieces of `op` are finished; the last one runs a write's finishing steps (truncate,
  // fdatasync), counts the operation's outcome, closes the descriptors and wakes the waiters.
  void finish_piece(Operation& op, std::size_t count, StatsShard& stats);
  // Fails `op` with `error`: its pieces nobody has taken yet are skipped, and `held` pieces the
  // caller has taken are counted as finished.
  void fail(Operation& op, std::exception_ptr error, std::size_t held, StatsShard& stats);
  // Cancels `op` from any thread (Handle::cancel, an interrupted blocking call): when some of its
  // pieces have not been taken by a worker yet, they are skipped and `op` fails with `error` as
  // with fail() (the pieces in flight finish as usual, and the last of them finishes `op`);
  // returns true. An operation whose pieces are all taken is left to finish as it will: false;
  // so is one not queued yet (a ticket is known a moment before its operations are queued).
  bool cancel(Operation& op, std::exception_ptr error, StatsShard& stats);
  // After a worker died: records `error` as the handle's, so that no operation is started from
  // now on, and fails every queued operation with it. Allocates nothing.
  void worker_died(const std::exception_ptr& error, StatsShard& stats);
  // The error of a dead worker, or null while all are alive.
  std::exception_ptr worker_failure();
  // True when no operation is queued or running (the caller-driven path's test, handle/
  // caller_lane.hpp: the handle's workers have nothing to do).
  bool idle();
  // Blocks until `op` has finished: returns true. An Interruptible wait returns false instead when
  // the thread's InterruptCheck said to stop (core/interrupt.hpp); `op` goes on.
  static bool wait_finished(Operation& op, WaitMode mode = WaitMode::Uninterruptible);
  // `hook` is called by a worker that has waited `period` for work in vain, outside the queue's
  // lock, and again after each further `period` while it returns true; it is armed again when an
  // operation is queued. Set before any worker starts (not synchronised).
  void set_idle_hook(std::function<bool()> hook, std::chrono::milliseconds period);
  // Arms the hook as a push does, for an operation run elsewhere (the caller-driven path, handle/
  // caller_lane.hpp), waking a worker to wait for the period when it was not armed.
  void arm_idle_hook();
  // Waits until no operation is alive, then wakes the workers to stop.
  void stop();
  // True once stop() was called and nothing is queued: a worker with nothing in flight exits.
  bool should_exit();

  // Waking a worker blocked in its engine. A worker with requests in flight waits in the kernel
  // for a completion, not on cv_, so a piece queued meanwhile would wait for the next completion
  // (on a drive that completes in bursts, for a whole burst) with the worker's slots idle. Each
  // worker gets an eventfd its engine watches (Engine::watch), written by push() when the worker
  // said it is about to block there.
  //
  // Makes the eventfds of `workers` workers; called before any worker starts. Without descriptors
  // left (EMFILE) there are none, and workers wait for their completions as before. The count
  // also lets push() wake only as many sleeping workers as the operation has pieces.
  void prepare_wakeups(unsigned workers) noexcept;
  // Worker `worker`'s eventfd, or -1 when it has none.
  int wakeup_fd(unsigned worker) const noexcept;
  // Operations queued so far; a worker reads it before it takes pieces (sequentially consistent).
  std::uint64_t pushes() const noexcept { return pushes_.load(std::memory_order_seq_cst); }
  // Worker `worker` is about to block in its engine, having taken pieces with pushes() at `seen`.
  // Returns false, and the worker must not block, when an operation was queued since: push()
  // either sees the flag set here and writes the eventfd, or is seen here (both sides are
  // sequentially consistent). Call blocked_in_engine_done() after the wait.
  bool block_in_engine(unsigned worker, std::uint64_t seen) noexcept;
  void blocked_in_engine_done(unsigned worker) noexcept;

 private:
  // A cache line each: every push reads the flags, and each worker writes its own.
  struct alignas(64) Wakeup {
    FileDescriptor eventfd;
    std::atomic<bool> blocked{false};  // the worker is, or is about to be, waiting in its engine
  };
  // Writes the eventfd of up to `pieces` workers blocked in their engines.
  void wake_blocked(std::size_t pieces) noexcept;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<OperationPtr> queue_;
  // Operations queued so far: an idle worker polls it for a new one before it sleeps.
  std::atomic<std::uint64_t> pushes_{0};
  bool stopping_ = false;
  std::exception_ptr worker_error_;  // set once, when a worker stops on an escaped exception
  std::function<bool()> idle_hook_;
  std::chrono::milliseconds idle_period_{0};
  bool idle_armed_ = false;  // guarded by mutex_
  // Guarded by mutex_: an idle worker is polling pushes_ (no other starts to), and a push has
  // counted on it to take its piece (the next pushes wake sleepers instead).
  bool spinner_ = false;
  bool spinner_counted_on_ = false;

  std::mutex live_mutex_;
  std::condition_variable live_cv_;
  std::size_t live_ops_ = 0;  // queued or running: stop() waits for them

  // One per worker, made before the workers start and kept until the queue goes (after every
  // worker and every thread that may push), so a write never meets a closed descriptor.
  std::unique_ptr<Wakeup[]> wakeups_;
  unsigned wakeup_count_ = 0;
  unsigned workers_ = 0;  // set by prepare_wakeups(); 0: unknown, push() wakes every sleeper
};

}  // namespace nvio::detail

template <>
struct fmt::formatter<nvio::detail::NameRef> : fmt::formatter<std::string_view> {
  auto format(const nvio::detail::NameRef& name, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(name.str(), ctx);
  }
};
