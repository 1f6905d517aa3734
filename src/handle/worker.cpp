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
// A slot's requests go to one of the worker's engines: the one of the handle's options, or, for
// device memory that an engine moves itself (Operation::device_direct()),
// engine::kDeviceDirectEngine (psync-shaped: the transfer runs in submit(), its result comes back
// through reap()). The worker never asks which kinds they are; what differs is the plan: the
// device-direct engine takes any offset, so its short transfers resume where they stopped, not at
// an aligned point.
//
// Counting (Handle::stats(), handle/stats.hpp): the worker counts into its own shard what happens
// to its slots, for every engine alike: a piece once its transfer has completed (and how it moved),
// each request offered again (retry), each short completion; an operation's outcome is counted
// where its last piece finishes (OperationQueue::finish_piece).
//
// Invariants, held here and in worker_copies.cpp (the bounce lane), nowhere else:
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

#include "handle/worker_impl.hpp"

namespace nvio::detail::worker_impl {
namespace {

// Reap failures in a row, after which the engine counts as broken and the worker stops.
constexpr unsigned kReapFailures = 16;

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

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

}  // namespace

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
  watching_ = settings.overlap_events && wakeup >= 0 && engine(kHandleEngine).watch(wakeup);
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
  r.file = s.op->registration.get();
  // A bounced piece's memory is the bounce chunk, host memory.
  r.device = s.bounce == nullptr && s.op->memory == MemoryKind::Device ? s.op->device : -1;
  r.region = s.region;
  return r;
}

int Worker::region_of(const std::byte* chunk) {
  BouncePool& pool = memory_->pool;
  // Each slab is offered to the handle's engine once, when a chunk of it is first used.
  while (regions_.size() < pool.slab_count()) {
    const std::span<std::byte> slab = pool.slab(regions_.size());
    regions_.push_back(engine(kHandleEngine).add_region(slab.data(), slab.size()));
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
    // Idle, a worker thread waits here for work; a caller-driven worker never waits for work.
    const bool idle = inflight_ == 0 && !settings_.caller_driven;
    const std::size_t limit =
        op ? std::max<std::size_t>(1, ceil_div(op->piece_count, settings_.intra_op_parallelism))
           : settings_.queue_depth;
    if (!queue_.take_piece(op, piece, memory_->pool.available(), idle, limit, taken_from_op)) {
      break;
    }
    taken_from_op = (op == last_op) ? taken_from_op + 1 : 1;
    last_op = op;
    if (op->failed()) {
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
  const unsigned engine_lane = op->device_direct() ? kDeviceDirect : kHandleEngine;
  // The handle's engine is made with the worker; the device-direct one when first needed.
  if (engine_lane == kDeviceDirect && !memory_->engines[kDeviceDirect]) {
    try {
      memory_->engines[kDeviceDirect] =
          engine::make_engine(engine::kDeviceDirectEngine, settings_.queue_depth);
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
  s.lane = engine_lane;
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

void Worker::submit_ready() {
  // Requests of operations that failed meanwhile are not sent: their slots retire now.
  std::size_t kept = 0;
  for (std::size_t k = 0; k < ready_.size(); ++k) {
    const unsigned i = ready_[k];
    if (slots_[i].op->failed()) {
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
  const bool wakeable = watching_ && lane == kHandleEngine && !free_.empty();
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
  if (op.failed()) {
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
    // The engine decodes its own result codes (a driver's, say) into the error.
    retire_failed(
        i, engine(lane).error(io_op(s), op.path, at, left, c.result,
                              s.direct && lane == kHandleEngine ? "O_DIRECT" : std::string{}));
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
  if (s.done < s.length && s.direct && lane == kHandleEngine) {
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
    // A read that keeps stopping short of an aligned point has met the end of a file cut since
    // it was opened at an unaligned size: a short file, not an I/O error.
    retire_failed(i, op.is_read() && file_now_ends_before(op, at + left)
                         ? ended_during_read(op, at)
                         : io_error_ptr(io_op(s), op.path, at, left, EIO,
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
    stats_.add(op.device_direct() ? Counter::GdsBytes : Counter::DeviceBounceBytes, s.length);
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
        // fill() found nothing more: a caller-driven worker is done with what its caller queued.
        if (settings_.caller_driven || queue_.should_exit()) return;
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
      const bool both = on_disk_[kHandleEngine] > 0 && on_disk_[kDeviceDirect] > 0;
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
            reap_waiting(kHandleEngine, 1);
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
  if (!idle && !in_engine_) {
    // An engine that only kept reporting failures (it did not throw) is closed, which releases its
    // descriptor: the kernel cancels what it still holds, and the memory those requests point
    // into stays abandoned. One that threw is in an unknown state and is abandoned with it.
    // Closed before the operations fail: a caller told of the failure releases its buffer, and
    // a close that waits for the kernel (libaio's io_destroy waits for every request it held)
    // then leaves nothing writing into it; io_uring's close only starts the kernel's
    // cancellation, so there the caveat above stays.
    try {
      for (auto& e : memory_->engines) e.reset();
    } catch (...) {
    }
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
  if (!idle) abandon(std::move(memory_));
}

}  // namespace nvio::detail::worker_impl

namespace nvio::detail {

DrivenWorker::DrivenWorker(const WorkerSettings& settings, OperationQueue& queue)
    : worker_(std::make_unique<worker_impl::Worker>(settings, queue)) {}

DrivenWorker::~DrivenWorker() = default;

void DrivenWorker::drive() noexcept { worker_->run(); }

void run_worker(const WorkerSettings& settings, OperationQueue& queue, std::promise<void> ready) {
  using worker_impl::Worker;
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
