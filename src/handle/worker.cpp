// The worker: one slot per request it may keep in flight, each slot an explicit state machine.
//
//   Free ──take a piece──► Ready ──engine accepted──► OnDisk ──completion──► (done / failed)
//     ▲                      ▲  ▲                        │
//     │  bounced write:      │  └── short transfer, ────┘
//     │   CopyingIn ─────────┘      EINTR / EAGAIN
//     │   (caller's memory → chunk)
//     │                           bounced read: CopyingOut (chunk → caller's memory) ──► done
//     └──────────────── retire: the chunk goes back to the pool, the generation moves on
//
// A device copy runs on the GPU (its event says when it is done). A host copy is made by the
// worker itself, one chunk at a time between its calls of the engine (see run()): the request of
// a chunk just filled is submitted before the next copy starts, and completions are reaped
// without waiting between copies, so that the drive keeps its queue while the worker copies.
//
// A slot's requests go to one of the worker's engines: the kernel engine of the handle's options,
// or, for device memory moved by GPUDirect Storage, the cuFile engine (psync-shaped: the transfer
// runs in submit(), its result comes back through reap()). The worker never branches on which.
//
// Counting (Handle::stats(), handle/stats.hpp): the worker counts into its own shard what happens
// to its slots, for every engine alike: a piece once its transfer has completed (and how it moved),
// each request offered again (retry), each short completion; an operation's outcome is counted
// where its last piece finishes (OperationQueue::finish_piece).
//
// Invariants, held here and nowhere else:
//   * a slot is retired (its bounce chunk reused, its operation told) only from Ready, or after
//     the engine gave its request back (completion) or its copy's event fired: never while the
//     kernel or a device copy may still use its memory;
//   * a request's tag is the slot's index and its generation, so a completion for a slot that was
//     retired meanwhile can never be applied to the slot's next piece;
//   * when the engine cannot report completions, the operations in flight fail at once but their
//     slots stay OnDisk until the engine gives them back (it is asked to cancel them); an engine
//     that keeps failing stops the worker, and its memory is then abandoned, never freed.
#include "handle/worker.hpp"

#include <cxxabi.h>
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <typeinfo>
#include <vector>

#include "core/retry.hpp"
#include "cuda/device_lane.hpp"
#include "handle/files.hpp"
#include "memory/bounce_pool.hpp"
#include "memory/user_copy.hpp"

namespace nvio::detail {
namespace {

using engine::Direction;

// Reap failures in a row, after which the engine counts as broken and the worker stops.
constexpr unsigned kReapFailures = 16;

// A worker's engines: the kernel engine of the handle's options, and cuFile for device memory
// moved by GPUDirect Storage (made when the worker first meets such an operation).
enum Lane : unsigned { kKernel = 0, kCuFile = 1 };
constexpr unsigned kLanes = 2;

enum class SlotState : std::uint8_t {
  Free,        // holds no piece
  CopyingIn,   // bounced write: the copy caller's memory -> bounce chunk is due or runs
  Ready,       // a request is due: waits in the ready list for the engine
  OnDisk,      // the engine accepted the request; its completion has not been reaped
  CopyingOut,  // bounced read: the copy bounce chunk -> caller's memory is due or runs
};

// A piece in flight on a worker, and where it stands after partial completions.
struct Slot {
  SlotState state = SlotState::Free;
  std::uint32_t generation = 0;
  OperationPtr op;
  std::uint64_t file_offset = 0;
  std::size_t length = 0;
  std::size_t done = 0;  // bytes transferred so far
  int fd = -1;
  bool direct = false;
  unsigned lane = kKernel;      // the engine its requests go to
  std::byte* user = nullptr;    // the piece's bytes in the caller's buffer (a shifted read's: where
                                // they land, Operation::landing)
  std::byte* bounce = nullptr;  // the aligned copy used for I/O, or null for zero-copy
  int region = -1;              // the kernel engine's region holding `bounce`, or -1
  RetryCounter retries{kTransferRetries};  // EINTR / EAGAIN / no progress, in a row
  bool freed_space = false;                // retried once after ENOSPC freed removed files' blocks
  std::uint64_t releases = removed_files_released();  // when the slot was last set up
};

// What the kernel or a device copy may use while a worker runs: its engine (an io_uring ring or
// aio context with requests in flight), the bounce chunks those requests and copies point into,
// and the CUDA state of those copies. Owned by its worker thread; kept on the heap so that a
// worker that stops with requests it cannot account for can abandon it (see abandon()).
struct WorkerMemory {
  WorkerMemory(std::unique_ptr<engine::Engine> e, std::size_t chunk, std::size_t count,
               unsigned slots)
      : pool(chunk, count) {
    engines[kKernel] = std::move(e);
    held.reserve(slots);  // die() adds to it without allocating
  }
  std::array<std::unique_ptr<engine::Engine>, kLanes> engines;  // kCuFile: null until needed
  BouncePool pool;
  std::unique_ptr<cuda::DeviceLane> lane;  // after `pool`: destroyed before it
  // The operations of requests left in an engine that could not be waited for (die()): a request
  // may point into memory its operation owns (a shifted read's tail buffer), kept with the rest.
  std::vector<OperationPtr> held;
};

// Keeps `memory` for the rest of the process, never freeing it: the kernel or a device may still
// write into it. The list keeps it reachable, so leak checkers stay quiet. Thread-safe.
void abandon(std::unique_ptr<WorkerMemory> memory) noexcept {
  static std::mutex mutex;
  try {
    std::lock_guard lock(mutex);
    static auto* kept = new std::vector<std::unique_ptr<WorkerMemory>>();
    kept->push_back(std::move(memory));  // on a throw, `memory` is left as it was
  } catch (...) {
    (void)memory.release();  // no memory to list it: leaked all the same
  }
}

// The error a worker reports when `cause` stopped it: MemoryError for std::bad_alloc, an
// nvio::Error naming the exception otherwise. `fallback` when there is no memory to say more.
std::exception_ptr worker_death_error(unsigned index, const std::exception_ptr& cause,
                                      const std::exception_ptr& fallback) noexcept {
  try {
    std::string what = "an exception of unknown type";
    bool oom = false;
    try {
      std::rethrow_exception(cause);
    } catch (const std::bad_alloc& e) {
      what = fmt::format("out of memory ({})", e.what());
      oom = true;
    } catch (const Error& e) {
      what = e.what();
    } catch (const std::exception& e) {
      int status = 0;
      char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
      what =
          fmt::format("{}: {}", status == 0 && name != nullptr ? name : typeid(e).name(), e.what());
      std::free(name);
    } catch (...) {
    }
    const std::string message = fmt::format(
        "worker thread {} of this handle stopped on an unexpected exception, {}; the operations "
        "it held failed and the handle runs no more operations: make a new one",
        index + 1, what);
    if (oom) return std::make_exception_ptr(MemoryError(message, ENOMEM));
    return std::make_exception_ptr(Error(message));
  } catch (...) {
    return fallback;
  }
}

std::exception_ptr gpu_error_ptr(cuda::DeviceOps& ops, const char* api, int code,
                                 const std::string& path, std::uint64_t offset,
                                 std::uint64_t length) {
  try {
    cuda::throw_gpu_error(ops, api, code, path, offset, length);
  } catch (...) {
    return std::current_exception();
  }
}

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

class Worker {
 public:
  // Makes everything the loop needs (engine, slots, buffers). Throws when it cannot.
  Worker(const WorkerSettings& settings, OperationQueue& queue);
  // Runs until the queue says stop with nothing in flight, or until the worker dies. Never
  // throws.
  void run() noexcept;

 private:
  std::uint64_t tag(unsigned i) const { return (std::uint64_t{slots_[i].generation} << 32) | i; }
  engine::Request request_for(unsigned i) const;
  IoOp io_op(const Slot& s) const { return s.op->is_read() ? IoOp::Read : IoOp::Write; }
  // The kernel engine's region (Engine::add_region) of bounce chunk `chunk`, or -1.
  int region_of(const std::byte* chunk);

  // Transitions.
  void fill();
  void start(const OperationPtr& op, const Piece& piece);
  void make_ready(unsigned i);
  void submit_ready();
  std::size_t reap(unsigned lane, std::size_t min_complete);
  // reap() that waits for `min_complete` (> 0) completions, or less when an operation is queued
  // meanwhile and a slot is free for its pieces.
  std::size_t reap_waiting(unsigned lane, std::size_t min_complete);
  // Takes back from engine `lane` the request a completion's tag names: its slot's index, or
  // nothing when the tag is not that of the slot's current piece on that engine (nothing may then
  // be applied to the slot). The slot leaves OnDisk.
  std::optional<unsigned> take_back(unsigned lane, std::uint64_t tag);
  std::size_t on_disk() const { return on_disk_[kKernel] + on_disk_[kCuFile]; }
  engine::Engine& engine(unsigned lane) { return *memory_->engines[lane]; }
  void on_completion(unsigned lane, const engine::Completion& c);
  void transfer_finished(unsigned i);
  void start_copy(unsigned i, bool to_device);
  std::size_t poll_copies(bool block_on_oldest);
  // Queues slot i's host copy (the slot moves to `state`, CopyingIn or CopyingOut).
  void queue_host_copy(unsigned i, SlotState state);
  // Makes the oldest queued host copy; its slot becomes Ready (write) or retires (read).
  void copy_next_host();
  bool copy_host(unsigned i);
  void engine_error(unsigned lane, int err);
  // Ends a slot: the piece is done (retire), or failed with `error` (retire_failed), or failed
  // with its chunk possibly still used by a device copy (quarantine: the chunk is never reused).
  void retire(unsigned i);
  void retire_failed(unsigned i, std::exception_ptr error);
  // Counts slot i's piece, whose transfer has completed, and how it moved.
  void count_piece(const Slot& s);
  void quarantine(unsigned i, std::exception_ptr error);
  OperationPtr release(unsigned i) noexcept;
  void die(std::exception_ptr cause) noexcept;

  WorkerSettings settings_;
  OperationQueue& queue_;
  StatsShard& stats_;
  std::unique_ptr<WorkerMemory> memory_;
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;         // Free slots
  std::vector<unsigned> ready_;        // Ready slots, in the order their requests are due
  std::vector<unsigned> copying_;      // device copies running, oldest first
  std::vector<unsigned> host_copies_;  // host copies due, oldest first
  std::vector<int> regions_;           // the kernel engine's region of each slab of the pool, or -1
  bool watching_ = false;              // the kernel engine watches the queue's eventfd for us
  std::uint64_t seen_pushes_ = 0;      // OperationQueue::pushes() when fill() last looked
  std::size_t inflight_ = 0;           // slots not Free
  std::array<std::size_t, kLanes> on_disk_{};  // OnDisk slots, by engine
  std::vector<engine::Request> requests_;
  std::vector<engine::Completion> completions_;
  UserCopier copier_;                             // bounce copies to and from the caller's memory
  RetryCounter submit_stalls_{kTransferRetries};  // submits taking nothing while none in flight
  unsigned reap_failures_ = 0;                    // reaps failing in a row
  bool in_engine_ = false;       // inside a call of the engine (a throw leaves the engine in doubt)
  std::size_t quarantined_ = 0;  // chunks never to be reused
  std::exception_ptr no_memory_error_;  // made up front: an exception's message needs memory
};

Worker::Worker(const WorkerSettings& settings, OperationQueue& queue)
    : settings_(settings), queue_(queue), stats_(*settings.stats) {
  const unsigned qd = settings.queue_depth;
  // Bounce chunks cover one piece each; 64 MiB of them per worker keeps the disk busy without
  // pinning queue_depth x block_size of memory.
  const std::size_t chunk = bounce_chunk_size(settings.block_size);
  const std::size_t bounce_count =
      std::min<std::size_t>(qd, std::max<std::size_t>(2, (std::size_t{64} << 20) / chunk));
  memory_ = std::make_unique<WorkerMemory>(engine::make_engine(settings.engine, qd), chunk,
                                           bounce_count, qd);
  // Pieces queued while the worker waits for a completion end that wait (OperationQueue::
  // block_in_engine); without overlap_events no piece starts before all have completed anyway.
  const int wakeup = queue_.wakeup_fd(settings.index);
  watching_ = settings.overlap_events && wakeup >= 0 && engine(kKernel).watch(wakeup);
  slots_.resize(qd);
  // Never more than qd entries in any of these: pushing to them does not allocate.
  free_.reserve(qd);
  for (unsigned i = qd; i > 0; --i) free_.push_back(i - 1);
  ready_.reserve(qd);
  copying_.reserve(qd);
  host_copies_.reserve(qd);
  regions_.reserve(64);  // more than the slabs of any pool: they double in size
  requests_.reserve(qd);
  completions_.resize(qd);
  no_memory_error_ = std::make_exception_ptr(MemoryError(
      fmt::format("worker thread {} of this handle stopped: out of memory (std::bad_alloc); the "
                  "operations it held failed and the handle runs no more operations: make a new "
                  "one",
                  settings.index + 1),
      ENOMEM));
}

engine::Request Worker::request_for(unsigned i) const {
  const Slot& s = slots_[i];
  std::byte* base = s.bounce != nullptr ? s.bounce : s.user;
  engine::Request r{
      s.fd, s.op->direction, base + s.done, s.length - s.done, s.file_offset + s.done, tag(i)};
  if (s.lane == kCuFile) {
    r.file_handle = s.op->cufile.get();
    r.device = s.op->device;
  } else {
    r.region = s.region;
  }
  return r;
}

int Worker::region_of(const std::byte* chunk) {
  BouncePool& pool = memory_->pool;
  // Each slab is offered to the kernel engine once, when a chunk of it is first used.
  while (regions_.size() < pool.slab_count()) {
    const std::span<std::byte> slab = pool.slab(regions_.size());
    regions_.push_back(engine(kKernel).add_region(slab.data(), slab.size()));
  }
  return regions_[pool.slab_of(chunk)];
}

OperationPtr Worker::release(unsigned i) noexcept {
  Slot& s = slots_[i];
  if (s.bounce != nullptr) memory_->pool.release(s.bounce);
  OperationPtr op = std::move(s.op);
  const std::uint32_t next = s.generation + 1;
  s = Slot{};
  s.generation = next;
  free_.push_back(i);
  --inflight_;
  return op;
}

void Worker::retire(unsigned i) {
  const OperationPtr op = release(i);
  queue_.finish_piece(*op, 1, stats_);
}

void Worker::retire_failed(unsigned i, std::exception_ptr error) {
  const OperationPtr op = release(i);
  queue_.fail(*op, std::move(error), 1, stats_);
}

void Worker::quarantine(unsigned i, std::exception_ptr error) {
  slots_[i].bounce = nullptr;  // never back to the pool
  ++quarantined_;
  retire_failed(i, std::move(error));
  if (quarantined_ >= memory_->pool.max_count()) {
    // No chunk is left for bounced pieces, which would then wait for ever: stop instead.
    throw GpuError("cuStreamSynchronize", -1, "",
                   "every bounce chunk of this worker may still be in use by a device copy that "
                   "could not be waited for");
  }
}

void Worker::make_ready(unsigned i) {
  slots_[i].state = SlotState::Ready;
  ready_.push_back(i);
}

void Worker::fill() {
  seen_pushes_ = queue_.pushes();  // before any early return: reap_waiting() compares with it
  // Without overlap_events, new pieces start only once the previous ones have all completed.
  if (!settings_.overlap_events && inflight_ > 0) return;
  // While the engine fails to report completions, nothing new starts on it until it has given
  // back every request it holds.
  if (reap_failures_ > 0) {
    if (on_disk() > 0) return;
    reap_failures_ = 0;
  }
  OperationPtr last_op;
  std::size_t taken_from_op = 0;
  while (!free_.empty()) {
    OperationPtr op = last_op;
    Piece piece;
    const bool idle = inflight_ == 0;
    const std::size_t limit =
        op ? std::max<std::size_t>(1, ceil_div(op->piece_count, settings_.intra_op_parallelism))
           : settings_.queue_depth;
    if (!queue_.take_piece(op, piece, memory_->pool.available(), idle, limit, taken_from_op)) {
      break;
    }
    taken_from_op = (op == last_op) ? taken_from_op + 1 : 1;
    last_op = op;
    if (op->failed.load(std::memory_order_acquire)) {
      queue_.finish_piece(*op, 1, stats_);
      continue;
    }
    start(op, piece);
  }
}

void Worker::start(const OperationPtr& op, const Piece& piece) {
  const bool device = op->memory == MemoryKind::Device;
  std::unique_ptr<cuda::DeviceLane>& lane = memory_->lane;
  if (device && (!lane || !lane->serves(op->device_ops))) {
    try {
      lane.reset();
      lane =
          std::make_unique<cuda::DeviceLane>(op->device_ops, settings_.queue_depth, memory_->pool);
    } catch (...) {
      lane.reset();
      queue_.fail(*op, std::current_exception(), 1, stats_);
      return;
    }
  }
  const bool gds = op->transport == cuda::Transport::Gds;
  if (gds && !memory_->engines[kCuFile]) {
    try {
      memory_->engines[kCuFile] = engine::make_cufile_engine(engine::real_cufile_calls());
    } catch (...) {
      queue_.fail(*op, std::current_exception(), 1, stats_);
      return;
    }
  }
  const unsigned i = free_.back();
  free_.pop_back();
  ++inflight_;
  Slot& s = slots_[i];
  s.state = SlotState::Ready;  // claimed; in the ready list only once its request is due
  s.op = op;
  s.file_offset = piece.file_offset;
  s.length = piece.length;
  s.direct = piece.direct;
  s.fd = piece.direct ? op->direct_fd : op->buffered_fd;
  s.lane = gds ? kCuFile : kKernel;
  s.user = op->landing(piece);
  if (op->needs_bounce(piece)) {
    try {
      s.bounce = memory_->pool.acquire();
      s.region = region_of(s.bounce);
    } catch (...) {
      retire_failed(i, std::current_exception());
      return;
    }
    if (!op->is_read()) {
      if (device) {
        start_copy(i, /*to_device=*/false);  // the request is due once the copy is done
        return;
      }
      queue_host_copy(i, SlotState::CopyingIn);  // the request is due once the copy is made
      return;
    }
  }
  make_ready(i);
}

void Worker::queue_host_copy(unsigned i, SlotState state) {
  slots_[i].state = state;
  host_copies_.push_back(i);
}

void Worker::copy_next_host() {
  const unsigned i = host_copies_.front();
  host_copies_.erase(host_copies_.begin());  // at most queue_depth entries: a short move
  Slot& s = slots_[i];
  if (s.op->failed.load(std::memory_order_acquire)) {
    retire(i);  // the operation failed meanwhile: its bytes no longer matter
    return;
  }
  const bool write = s.state == SlotState::CopyingIn;
  if (!copy_host(i)) return;
  if (write) {
    make_ready(i);
  } else {
    retire(i);
  }
}

bool Worker::copy_host(unsigned i) {
  Slot& s = slots_[i];
  const bool read = s.op->is_read();
  const UserCopyResult r = read ? copier_.to_user(s.user, s.bounce, s.length)
                                : copier_.from_user(s.bounce, s.user, s.length);
  if (r.error == 0) return true;
  // Memory the caller cannot access fails the operation with EFAULT, as the kernel does with
  // such a buffer.
  const void* where = s.user + r.fault_at;
  retire_failed(
      i, io_error_ptr(
             io_op(s), s.op->path, s.file_offset + r.fault_at, s.length - r.fault_at, r.error,
             fmt::format("copying {} the caller's buffer at {} ({})", read ? "into" : "out of",
                         where, read ? "is it writable?" : "is it readable?")));
  return false;
}

void Worker::start_copy(unsigned i, bool to_device) {
  Slot& s = slots_[i];
  Operation& op = *s.op;
  cuda::DeviceLane& lane = *memory_->lane;
  int code = cuda::kSuccess;
  const char* api = "";
  cuda::DeviceLane::Started started;
  try {
    started = to_device
                  ? lane.start_copy(i, op.device, s.user, s.bounce, s.length, true, code, api)
                  : lane.start_copy(i, op.device, s.bounce, s.user, s.length, false, code, api);
  } catch (...) {  // nothing was queued
    retire_failed(i, std::current_exception());
    return;
  }
  switch (started) {
    case cuda::DeviceLane::Started::Recorded:
      s.state = to_device ? SlotState::CopyingOut : SlotState::CopyingIn;
      copying_.push_back(i);
      return;
    case cuda::DeviceLane::Started::Failed:
      retire_failed(i, gpu_error_ptr(lane.ops(), api, code, op.path, s.file_offset, s.length));
      return;
    case cuda::DeviceLane::Started::InDoubt:
      quarantine(i, gpu_error_ptr(lane.ops(), api, code, op.path, s.file_offset, s.length));
      return;
  }
}

std::size_t Worker::poll_copies(bool block_on_oldest) {
  cuda::DeviceLane& lane = *memory_->lane;
  std::size_t progressed = 0;
  for (std::size_t k = 0; k < copying_.size();) {
    const unsigned i = copying_[k];
    const bool block = block_on_oldest && progressed == 0 && k == 0;
    const int rc =
        block ? lane.ops().event_synchronize(lane.event(i)) : lane.ops().event_query(lane.event(i));
    if (rc == cuda::kNotReady) {
      ++k;
      continue;
    }
    ++progressed;
    copying_.erase(copying_.begin() + static_cast<std::ptrdiff_t>(k));
    Slot& s = slots_[i];
    const bool to_device = s.state == SlotState::CopyingOut;
    if (rc != cuda::kSuccess) {
      // The event reports the copy's failure (CUDA reports asynchronous errors through the next
      // synchronising call) once the work before it has ended: the chunk is no longer in use.
      retire_failed(
          i, gpu_error_ptr(lane.ops(), to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", rc,
                           s.op->path, s.file_offset, s.length));
      continue;
    }
    if (to_device) {
      retire(i);
    } else {
      make_ready(i);  // the chunk holds the data: write it
    }
  }
  return progressed;
}

void Worker::submit_ready() {
  // Requests of operations that failed meanwhile are not sent: their slots retire now.
  std::size_t kept = 0;
  for (std::size_t k = 0; k < ready_.size(); ++k) {
    const unsigned i = ready_[k];
    if (slots_[i].op->failed.load(std::memory_order_acquire)) {
      retire(i);
    } else {
      ready_[kept++] = i;
    }
  }
  ready_.resize(kept);
  std::size_t pos = 0;
  while (pos < ready_.size()) {
    // The requests due next that go to the same engine, in order.
    const unsigned lane = slots_[ready_[pos]].lane;
    std::size_t n = 1;
    while (!settings_.single_submit && pos + n < ready_.size() &&
           slots_[ready_[pos + n]].lane == lane) {
      ++n;
    }
    engine::Engine& eng = engine(lane);
    requests_.clear();
    for (std::size_t k = pos; k < pos + n; ++k) requests_.push_back(request_for(ready_[k]));
    in_engine_ = true;
    const int rc = eng.submit(requests_);
    in_engine_ = false;
    if (rc > 0) {
      for (std::size_t k = pos; k < pos + static_cast<std::size_t>(rc); ++k) {
        slots_[ready_[k]].state = SlotState::OnDisk;
      }
      on_disk_[lane] += static_cast<std::size_t>(rc);
      pos += static_cast<std::size_t>(rc);
      submit_stalls_.progress();
      continue;
    }
    const bool busy = rc == 0 || rc == -EAGAIN || rc == -EBUSY;
    if (busy && on_disk_[lane] > 0) break;  // out of resources: reap, then offer again
    if (busy && submit_stalls_.retry(EAGAIN)) {
      stats_.add(Counter::Retries, 1);
      sched_yield();
      continue;
    }
    // The kernel refused the first request (or took none of them for too long): its piece fails.
    const unsigned i = ready_[pos];
    const Slot& s = slots_[i];
    const int err = rc < 0 ? -rc : EAGAIN;
    submit_stalls_.progress();
    retire_failed(i, io_error_ptr(IoOp::Submit, s.op->path, s.file_offset + s.done,
                                  s.length - s.done, err, fmt::format("{} engine", eng.name())));
    ++pos;
  }
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(pos));
}

std::size_t Worker::reap_waiting(unsigned lane, std::size_t min_complete) {
  const bool wakeable = watching_ && lane == kKernel && !free_.empty();
  if (wakeable && !queue_.block_in_engine(settings_.index, seen_pushes_)) return 0;
  const std::size_t got = reap(lane, min_complete);
  if (wakeable) queue_.blocked_in_engine_done(settings_.index);
  return got;
}

std::size_t Worker::reap(unsigned lane, std::size_t min_complete) {
  in_engine_ = true;
  const int got = engine(lane).reap(completions_, min_complete);
  in_engine_ = false;
  if (got < 0) {
    engine_error(lane, -got);
    return 0;
  }
  reap_failures_ = 0;
  for (int k = 0; k < got; ++k) on_completion(lane, completions_[static_cast<std::size_t>(k)]);
  return static_cast<std::size_t>(got);
}

void Worker::engine_error(unsigned lane, int err) {
  ++reap_failures_;
  if (reap_failures_ >= kReapFailures) {
    // Thrown into run(): the worker stops and abandons what the engine may still use.
    throw_io_error(IoOp::Wait, "(all files of this worker)", 0, 0, err,
                   fmt::format("the {} engine failed to report completions {} times in a row",
                               engine(lane).name(), reap_failures_));
  }
  if (is_transient(err)) return;   // nothing is lost: ask again
  if (reap_failures_ > 1) return;  // the operations in flight were failed already
  // Whether the requests in flight completed is unknown: none of their operations may report
  // success. They fail now; their slots stay OnDisk until the engine gives them back.
  for (Slot& s : slots_) {
    if (s.state != SlotState::OnDisk || s.lane != lane) continue;
    queue_.fail(*s.op,
                io_error_ptr(IoOp::Wait, s.op->path, s.file_offset + s.done, s.length - s.done, err,
                             fmt::format("{} engine", engine(lane).name())),
                0, stats_);
  }
  engine(lane).cancel();
}

std::optional<unsigned> Worker::take_back(unsigned lane, std::uint64_t tag) {
  const auto i = static_cast<unsigned>(tag & 0xffff'ffffu);
  if (i >= slots_.size() || slots_[i].state != SlotState::OnDisk || slots_[i].lane != lane ||
      slots_[i].generation != static_cast<std::uint32_t>(tag >> 32)) {
    return std::nullopt;
  }
  slots_[i].state = SlotState::Ready;  // given back by the engine; in the ready list only if resent
  --on_disk_[lane];
  return i;
}

void Worker::on_completion(unsigned lane, const engine::Completion& c) {
  const std::optional<unsigned> taken = take_back(lane, c.tag);
  if (!taken) return;
  const unsigned i = *taken;
  Slot& s = slots_[i];
  Operation& op = *s.op;
  if (op.failed.load(std::memory_order_acquire)) {
    retire(i);  // the operation failed meanwhile: nothing more of it is done
    return;
  }
  const std::uint64_t at = s.file_offset + s.done;
  const std::size_t left = s.length - s.done;
  if (c.result < 0) {
    const int err = static_cast<int>(-c.result);
    // Out of space while some handle of the process keeps removed files (their blocks): let go
    // of them everywhere and try once more (see handle/files.hpp).
    const bool freed = err == ENOSPC && !s.freed_space && release_removed_files() != s.releases;
    s.freed_space = s.freed_space || freed;
    if (freed || s.retries.retry(err)) {
      stats_.add(Counter::Retries, 1);
      make_ready(i);
      return;
    }
    // The engine decodes its own result codes (cuFile's, say) into the error.
    retire_failed(i, engine(lane).error(io_op(s), op.path, at, left, c.result,
                                        s.direct && lane == kKernel ? "O_DIRECT" : std::string{}));
    return;
  }
  if (c.result == 0) {
    retire_failed(i, op.is_read() ? ended_during_read(op, at)
                                  : io_error_ptr(IoOp::Write, op.path, at, left, EIO,
                                                 "write transferred 0 bytes"));
    return;
  }
  if (static_cast<std::uint64_t>(c.result) > left) {
    retire_failed(i, io_error_ptr(io_op(s), op.path, at, left, EIO,
                                  fmt::format("the engine reported {} bytes transferred of {}",
                                              c.result, left)));
    return;
  }
  const std::size_t before = s.done;
  s.done += static_cast<std::size_t>(c.result);
  if (s.done < s.length) stats_.add(Counter::ShortTransfers, 1);
  if (s.done < s.length && s.direct && lane == kKernel) {
    // A short direct transfer resumes with direct I/O, from the last aligned point (see
    // direct_resume_point): never through the page cache beside direct-written bytes.
    const std::byte* base = s.bounce != nullptr ? s.bounce : s.user;
    s.done = direct_resume_point(s.done, s.file_offset, reinterpret_cast<std::uintptr_t>(base),
                                 op.dio_offset_align, op.mem_align);
  }
  if (s.done > before) {
    s.retries.progress();
  } else if (s.retries.retry(EAGAIN)) {
    stats_.add(Counter::Retries, 1);
  } else {
    retire_failed(i, io_error_ptr(io_op(s), op.path, at, left, EIO,
                                  "short O_DIRECT transfers made no aligned progress"));
    return;
  }
  if (s.done < s.length) {
    make_ready(i);
    return;
  }
  transfer_finished(i);
}

void Worker::count_piece(const Slot& s) {
  const Operation& op = *s.op;
  stats_.add(Counter::Pieces, 1);
  if (op.memory == MemoryKind::Device) {
    stats_.add(s.lane == kCuFile ? Counter::GdsBytes : Counter::DeviceBounceBytes, s.length);
  } else if (s.bounce != nullptr) {
    stats_.add(Counter::BouncedBytes, s.length);
  } else if (s.direct && op.lands_shifted(s.file_offset)) {
    stats_.add(Counter::ShiftedBytes, s.length);
  }
  // A buffered piece of a request planned with direct I/O is one of its unaligned edges, unless it
  // was found in the page cache.
  if (op.cached.holds(op.plan, s.file_offset)) {
    stats_.add(Counter::CachedBytes, s.length);
  } else if (!s.direct && op.plan.direct) {
    stats_.add(Counter::EdgeBytes, s.length);
  }
}

void Worker::transfer_finished(unsigned i) {
  Slot& s = slots_[i];
  count_piece(s);
  if (s.op->lands_shifted(s.file_offset)) {
    // A shifted read's member landed: the slot is free now, the move comes in file order.
    const std::size_t member = ShiftedRead::member(s.op->plan, s.file_offset);
    const OperationPtr op = release(i);
    const std::size_t finished = op->shifted->landed(*op, member);
    if (finished > 0) queue_.finish_piece(*op, finished, stats_);
    return;
  }
  if (s.bounce != nullptr && s.op->is_read()) {
    if (s.op->memory == MemoryKind::Device) {
      start_copy(i, /*to_device=*/true);  // done once the copy to the device is
    } else {
      queue_host_copy(i, SlotState::CopyingOut);  // done once the copy is made
    }
    return;
  }
  retire(i);
}

void Worker::run() noexcept {
  try {
    for (;;) {
      fill();
      const std::size_t copies_done = copying_.empty() ? 0 : poll_copies(false);
      if (!ready_.empty()) submit_ready();
      if (inflight_ == 0) {
        if (queue_.should_exit()) return;
        continue;
      }
      if (!host_copies_.empty()) {
        // One chunk's copy, then back to the engines without waiting: a written chunk's request
        // goes out at the top of the loop, before the next copy, and a read chunk copied out
        // frees its slot for the next piece.
        copy_next_host();
        for (unsigned lane = 0; lane < kLanes; ++lane) {
          if (on_disk_[lane] > 0) reap(lane, 0);
        }
        continue;
      }
      const bool both = on_disk_[kKernel] > 0 && on_disk_[kCuFile] > 0;
      if (!copying_.empty() || both) {
        // Several things are pending (copies, or both engines): never block in one while another
        // may finish; block only when nothing moved, on the oldest copy or else the kernel.
        std::size_t got = 0;
        for (unsigned lane = 0; lane < kLanes; ++lane) {
          if (on_disk_[lane] > 0) got += reap(lane, 0);
        }
        if (got == 0 && copies_done == 0) {
          if (!copying_.empty()) {
            poll_copies(true);
          } else {
            reap_waiting(kKernel, 1);
          }
        }
      } else {
        // One engine has requests: at least one completion (overlap_events), or all of them.
        for (unsigned lane = 0; lane < kLanes; ++lane) {
          if (on_disk_[lane] > 0) {
            reap_waiting(lane, settings_.overlap_events ? 1 : on_disk_[lane]);
          }
        }
      }
    }
  } catch (...) {
    die(std::current_exception());
  }
}

void Worker::die(std::exception_ptr cause) noexcept {
  // An exception escaped the loop (std::bad_alloc while making an error, an engine that keeps
  // failing). Ending the thread with it would end the process, so the worker stops here instead:
  // the handle takes no more operations, the queued ones fail, and every operation this worker
  // holds fails once nothing of its pieces is in use any more. Nothing below throws or waits for
  // ever.
  const std::exception_ptr error = worker_death_error(settings_.index, cause, no_memory_error_);
  queue_.worker_died(error, stats_);
  // The kernel may still be transferring pieces handed to the engine, and a device copy may still
  // use a chunk: wait for them, so that neither the caller's buffers nor the chunks are released
  // while in use. An engine that threw or keeps failing is in an unknown state and is not waited
  // on (that could hang): then the memory is abandoned, never freed. In that case only, the
  // kernel may still write into the caller's buffer of a piece after its operation reports the
  // failure: that cannot be waited for without a working engine, and a waiter must not hang.
  bool idle = !in_engine_ && reap_failures_ < kReapFailures;
  try {
    cuda::DeviceLane* lane = memory_->lane.get();
    for (const unsigned i : copying_) {
      if (lane == nullptr || lane->ops().event_synchronize(lane->event(i)) != cuda::kSuccess) {
        idle = false;
      }
    }
    for (unsigned lane = 0; lane < kLanes; ++lane) {
      if (idle && on_disk_[lane] > 0) engine(lane).cancel();
      while (idle && on_disk_[lane] > 0) {
        const int got = retry_interrupted([&] { return engine(lane).reap(completions_, 1); });
        if (got < 0) {
          idle = false;
          break;
        }
        for (int k = 0; k < got; ++k)
          take_back(lane, completions_[static_cast<std::size_t>(k)].tag);
      }
    }
  } catch (...) {
    idle = false;
  }
  for (Slot& s : slots_) {
    if (!s.op) continue;
    const OperationPtr op = std::move(s.op);
    queue_.fail(*op, error, 1, stats_);
    if (!idle && (s.state == SlotState::OnDisk || s.state == SlotState::CopyingIn ||
                  s.state == SlotState::CopyingOut)) {
      memory_->held.push_back(op);  // within the reserved capacity: does not allocate
    }
  }
  if (!idle) {
    // An engine that only kept reporting failures (it did not throw) is closed, which releases its
    // descriptor: the kernel cancels what it still holds, and the memory those requests point
    // into stays abandoned. One that threw is in an unknown state and is abandoned with it.
    if (!in_engine_) {
      try {
        for (auto& e : memory_->engines) e.reset();
      } catch (...) {
      }
    }
    abandon(std::move(memory_));
  }
}

}  // namespace

void run_worker(const WorkerSettings& settings, OperationQueue& queue, std::promise<void> ready) {
  std::unique_ptr<Worker> worker;
  // Everything the loop needs is made before the handle's constructor returns, so that a failure
  // here (no engine, no memory) is that constructor's error.
  try {
    worker = std::make_unique<Worker>(settings, queue);
  } catch (const std::bad_alloc&) {
    try {
      ready.set_exception(std::make_exception_ptr(
          MemoryError("no memory for a worker thread's queue and bounce buffers", ENOMEM)));
    } catch (...) {  // not even for the message: the std::bad_alloc is reported
      ready.set_exception(std::current_exception());
    }
    return;
  } catch (...) {
    ready.set_exception(std::current_exception());
    return;
  }
  ready.set_value();
  worker->run();
}

}  // namespace nvio::detail
