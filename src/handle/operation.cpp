#include "handle/operation.hpp"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "core/spin.hpp"

namespace nvio::detail {

namespace {
// Known when the library is loaded, for the reason given at locked_regions() (aligned_buffer.cpp):
// waiters on worker threads ask it.
[[maybe_unused]] const bool g_spinning_pays_at_load = spinning_pays();
}  // namespace

std::exception_ptr io_error_ptr(IoOp op, const std::string& path, std::uint64_t offset,
                                std::uint64_t length, int err, const std::string& detail) {
  try {
    throw_io_error(op, path, offset, length, err, detail);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr ended_during_read(const Operation& op, std::uint64_t at) {
  // The file's size now: it may have shrunk since it was opened.
  FileFacts now;
  const bool known = file_facts(op.any_fd(), now) == 0 && now.size >= 0;
  try {
    throw ShortFile::ended_during_read(op.path, op.offset, op.length, at,
                                       known ? static_cast<std::uint64_t>(now.size) : at);
  } catch (...) {
    return std::current_exception();
  }
}

bool file_now_ends_before(const Operation& op, std::uint64_t end) {
  FileFacts now;
  return file_facts(op.any_fd(), now) == 0 && now.size >= 0 &&
         static_cast<std::uint64_t>(now.size) < end;
}

void ShiftedRead::AlignedDelete::operator()(std::byte* p) const noexcept {
  ::operator delete[](p, align);
}

ShiftedRead::ShiftedRead(std::size_t shift, std::size_t members, std::size_t tail_length,
                         std::size_t tail_align)
    : shift_(shift),
      tail_(static_cast<std::byte*>(::operator new[](tail_length, std::align_val_t{tail_align})),
            AlignedDelete{std::align_val_t{tail_align}}),
      states_(members, State::Pending) {}

std::size_t ShiftedRead::member(const Plan& plan, std::uint64_t file_offset) noexcept {
  if (file_offset >= plan.tail_begin) return plan.middle_pieces();
  return static_cast<std::size_t>((file_offset - plan.head_end) / plan.piece_size);
}

void ShiftedRead::move(const Operation& op, std::size_t k) const noexcept {
  const Plan& plan = op.plan;
  if (k == plan.middle_pieces()) {  // the tail, from the operation's own buffer
    std::memcpy(op.user(plan.tail_begin), tail_.get(),
                static_cast<std::size_t>(plan.end - plan.tail_begin));
    return;
  }
  const Piece piece = plan.piece(k + (plan.has_head() ? 1 : 0));
  std::byte* place = op.user(piece.file_offset);
  std::memmove(place, place + shift_, piece.length);
}

std::size_t ShiftedRead::collect_landed() {
  std::size_t count = 0;
  for (State& s : states_) {
    if (s == State::Landed) {
      s = State::Done;
      ++count;
    }
  }
  return count;
}

std::size_t ShiftedRead::landed(const Operation& op, std::size_t k) {
  std::unique_lock lock(mutex_);
  const auto stopped = [&] { return abandoned_ || op.failed(); };
  if (stopped()) {
    states_[k] = State::Done;
    return 1;
  }
  states_[k] = State::Landed;
  std::size_t finished = 0;
  // Only the thread that finds the next member landed moves: next_ changes only here.
  while (next_ < states_.size() && states_[next_] == State::Landed && !stopped()) {
    const std::size_t m = next_;
    states_[m] = State::Moving;  // abandon() leaves it to this thread
    lock.unlock();
    move(op, m);
    lock.lock();
    states_[m] = State::Done;
    ++next_;
    ++finished;
  }
  if (stopped()) finished += collect_landed();
  return finished;
}

std::size_t ShiftedRead::abandon() {
  std::lock_guard lock(mutex_);
  abandoned_ = true;
  return collect_landed();
}

std::shared_ptr<const engine::FileRegistration> OpenFile::registration(
    const std::function<std::shared_ptr<const engine::FileRegistration>()>& make) const {
  std::call_once(registration_once_, [&] {
    try {
      registration_ = make();
    } catch (...) {
      registration_error_ = std::current_exception();
    }
  });
  if (registration_error_) std::rethrow_exception(registration_error_);
  return registration_;
}

void OperationQueue::push(const OperationPtr& op, StatsShard& stats) {
  {
    std::lock_guard lock(live_mutex_);
    ++live_ops_;
  }
  if (op->piece_count == 0) {  // zero-length: only the write's finishing steps remain
    finish_piece(*op, 0, stats);
    return;
  }
  std::exception_ptr refused;  // why the operation is not queued
  bool spinner = false;        // an idle worker polls for this push: it takes one piece
  {
    std::lock_guard lock(mutex_);
    spinner = spinner_ && !spinner_counted_on_;
    if (spinner) spinner_counted_on_ = true;  // it takes one piece: this push's
    refused = worker_error_;
    if (!refused) {
      idle_armed_ = static_cast<bool>(idle_hook_);
      try {
        queue_.push_back(op);
        op->advance(Lifecycle::Queued);
        pushes_.fetch_add(1, std::memory_order_seq_cst);  // see block_in_engine()
      } catch (...) {                                     // std::bad_alloc
        refused = std::current_exception();
        try {
          refused = std::make_exception_ptr(
              MemoryError(fmt::format("{}: no memory to queue the operation", op->path), ENOMEM));
        } catch (...) {  // not even for the message: the std::bad_alloc is reported
        }
      }
    }
  }
  if (refused) {
    // A worker died after the operation was prepared, or it could not be queued: it never
    // starts, and finishing it here keeps stop() from waiting for it.
    op->record_error(refused);
    finish_piece(*op, op->piece_count, stats);
    return;
  }
  // As many sleeping workers as there are pieces for, not all: each woken one takes the mutex.
  const std::size_t pieces = op->piece_count - (spinner ? 1 : 0);
  if (workers_ == 0 || pieces >= workers_) {
    cv_.notify_all();
  } else {
    for (std::size_t i = 0; i < pieces; ++i) cv_.notify_one();
  }
  wake_blocked(op->piece_count);
}

void OperationQueue::prepare_wakeups(unsigned workers) noexcept {
  workers_ = workers;
  try {
    auto made = std::make_unique<Wakeup[]>(workers);
    for (unsigned i = 0; i < workers; ++i) {
      made[i].eventfd = FileDescriptor(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (!made[i].eventfd) return;
    }
    wakeups_ = std::move(made);
    wakeup_count_ = workers;
  } catch (const std::bad_alloc&) {  // no wakeups: workers wait for completions as before
  }
}

int OperationQueue::wakeup_fd(unsigned worker) const noexcept {
  return worker < wakeup_count_ ? wakeups_[worker].eventfd.get() : -1;
}

bool OperationQueue::block_in_engine(unsigned worker, std::uint64_t seen) noexcept {
  Wakeup& w = wakeups_[worker];
  w.blocked.store(true, std::memory_order_seq_cst);
  if (pushes_.load(std::memory_order_seq_cst) == seen) return true;
  w.blocked.store(false, std::memory_order_relaxed);
  return false;
}

void OperationQueue::blocked_in_engine_done(unsigned worker) noexcept {
  wakeups_[worker].blocked.store(false, std::memory_order_relaxed);
}

void OperationQueue::wake_blocked(std::size_t pieces) noexcept {
  for (unsigned i = 0; i < wakeup_count_ && pieces > 0; ++i) {
    Wakeup& w = wakeups_[i];
    // The load first: a worker not blocked costs no atomic write. exchange: one write per block.
    if (!w.blocked.load(std::memory_order_seq_cst) || !w.blocked.exchange(false)) continue;
    const std::uint64_t one = 1;
    // EAGAIN (the counter full) leaves it readable: the worker wakes all the same.
    [[maybe_unused]] const ssize_t rc = ::write(w.eventfd.get(), &one, sizeof one);
    --pieces;
  }
}

void OperationQueue::set_idle_hook(std::function<bool()> hook, std::chrono::milliseconds period) {
  idle_hook_ = std::move(hook);
  idle_period_ = period;
}

bool OperationQueue::take_piece(OperationPtr& op, Piece& piece, bool bounce_ok, bool wait_for_work,
                                std::size_t per_op_limit, std::size_t taken_from_op) {
  std::unique_lock lock(mutex_);
  bool polled = false;
  for (;;) {
    while (!queue_.empty() && queue_.front()->next_piece >= queue_.front()->piece_count) {
      queue_.pop_front();
    }
    if (!queue_.empty() || stopping_ || !wait_for_work) break;
    if (!polled && !spinner_) {
      // The next submission often follows within microseconds (a caller waiting for each small
      // operation before the next): poll for it before sleeping (core/spin.hpp). One idle worker
      // at a time: several polling would take the CPUs from the caller and the kernel, and all
      // rush for the one operation that comes.
      polled = true;
      spinner_ = true;
      spinner_counted_on_ = false;
      const std::uint64_t seen = pushes_.load(std::memory_order_acquire);
      lock.unlock();
      spin_until(kWorkSpinLimit, [&] { return pushes_.load(std::memory_order_acquire) != seen; });
      lock.lock();
      spinner_ = false;
      continue;
    }
    if (!idle_armed_) {
      cv_.wait(lock);
    } else if (cv_.wait_for(lock, idle_period_) == std::cv_status::timeout && queue_.empty() &&
               !stopping_) {
      idle_armed_ = false;  // one worker runs the hook at a time
      lock.unlock();
      const bool again = idle_hook_();
      lock.lock();
      idle_armed_ = idle_armed_ || again;
    }
  }
  if (queue_.empty()) return false;
  Operation& head = *queue_.front();
  if (op.get() == &head && taken_from_op >= per_op_limit) return false;
  const Piece p = head.piece(head.next_piece);
  if (!bounce_ok && head.needs_bounce(p)) {
    // push() may have woken only this worker for the piece: another one with bounce chunks free
    // takes it instead, sleeping or waiting in its engine.
    cv_.notify_one();
    wake_blocked(1);
    return false;
  }
  ++head.next_piece;
  op = queue_.front();
  piece = p;
  return true;
}

void OperationQueue::finish_piece(Operation& op, std::size_t count, StatsShard& stats) {
  if (count > 0 && op.remaining.fetch_sub(count, std::memory_order_acq_rel) != count) return;
  // Last piece: the write's finishing steps, then release the descriptors and wake the waiter.
  // Only one thread gets here per operation; a second would be a counting bug, and finishing
  // twice would count the outcome twice and release what a waiter may hold.
  if (!op.advance(Lifecycle::Finishing)) return;
  if (!op.has_error() && !op.is_read()) {
    const int fd = op.any_fd();
    if (op.write_options.truncate == Truncate::AtEnd &&
        ::ftruncate(fd, static_cast<off_t>(op.end())) != 0) {
      op.record_error(io_error_ptr(IoOp::Truncate, op.path, op.end(), 0, errno));
    } else if (op.write_options.durability == Durability::Data && ::fdatasync(fd) != 0) {
      op.record_error(io_error_ptr(IoOp::Sync, op.path, op.offset, op.length, errno));
    }
  }
  if (op.batch) {
    BatchFinish& b = *op.batch;
    if (op.has_error()) b.failed.store(true, std::memory_order_release);
    if (b.left.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
        !b.failed.load(std::memory_order_acquire) && b.durability == Durability::Data) {
      for (const auto& file : b.files) {
        if (::fdatasync(file->any_fd()) != 0) {
          op.record_error(io_error_ptr(IoOp::Sync, op.path, op.offset, op.length, errno,
                                       "syncing the files of the batch"));
          break;
        }
      }
    }
  }
  std::exception_ptr error;  // the outcome is final now
  {
    std::lock_guard lock(op.mutex);
    op.registration.reset();  // an operation's own registration goes before its descriptor closes
    // Counted by queue_job, which queues every operation that reaches this point.
    if (op.file != nullptr) op.file->queued_ops.fetch_sub(1, std::memory_order_relaxed);
    op.file.reset();
    op.batch.reset();
    op.finished_at = std::chrono::steady_clock::now();
    error = op.error;
  }
  if (error) {
    stats.failed(error);
  } else if (op.is_read()) {
    stats.add(Counter::Reads, 1);
    stats.add(Counter::BytesRead, op.length);
  } else {
    stats.add(Counter::Writes, 1);
    stats.add(Counter::BytesWritten, op.length);
  }
  // Before Finished: a wait that collects the ticket (and may drop the listener's record of it)
  // waits for Finished, so the listener's record is alive during the call.
  const bool job_complete = op.listener != nullptr && op.listener->operation_finished(op);
  {
    std::lock_guard lock(op.mutex);
    op.advance(Lifecycle::Finished);
  }
  op.finished_cv.notify_all();
  // The caller of finish_piece still holds `op`, and the listener (the handle) outlives every
  // live operation: stop() waits for live_ops_ below.
  if (job_complete) op.listener->wake_collectors();
  {
    std::lock_guard lock(live_mutex_);
    --live_ops_;
  }
  live_cv_.notify_all();
}

void OperationQueue::fail(Operation& op, std::exception_ptr error, std::size_t held,
                          StatsShard& stats) {
  op.record_error(std::move(error));
  // Pieces nobody has taken yet will not run: count them as finished now.
  std::size_t skipped = 0;
  {
    std::lock_guard lock(mutex_);
    skipped = op.piece_count - op.next_piece;
    op.next_piece = op.piece_count;
  }
  // A shifted read's landed pieces waiting for a move will not be moved either.
  if (op.shifted) skipped += op.shifted->abandon();
  if (skipped + held > 0) finish_piece(op, skipped + held, stats);
}

bool OperationQueue::cancel(Operation& op, std::exception_ptr error, StatsShard& stats) {
  std::size_t skipped = 0;
  {
    std::lock_guard lock(mutex_);
    // Not queued (yet, or ever: refused, or no pieces): push() finishes it on its own path, and a
    // finish here too would count its pieces twice. One queued and finishing has no piece left.
    const Lifecycle now = op.state.load(std::memory_order_acquire);
    if (now != Lifecycle::Queued && now != Lifecycle::Failed) return false;
    skipped = op.piece_count - op.next_piece;
    op.next_piece = op.piece_count;
  }
  if (skipped == 0) return false;
  // The skipped pieces are still counted in `remaining`: the operation cannot finish before the
  // error is recorded.
  op.record_error(std::move(error));
  if (op.shifted) skipped += op.shifted->abandon();
  finish_piece(op, skipped, stats);
  return true;
}

void OperationQueue::worker_died(const std::exception_ptr& error, StatsShard& stats) {
  // One operation at a time, so that nothing is allocated here (the worker may be out of memory).
  // Pieces of these operations that other workers have taken finish there as usual; the rest are
  // skipped. An operation whose pieces are all taken already is left to its workers.
  for (bool first = true;; first = false) {
    OperationPtr op;
    bool untaken = false;
    {
      std::lock_guard lock(mutex_);
      if (first && !worker_error_) worker_error_ = error;
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      untaken = op->next_piece < op->piece_count;
    }
    if (untaken) fail(*op, error, 0, stats);
  }
}

std::exception_ptr OperationQueue::worker_failure() {
  std::lock_guard lock(mutex_);
  return worker_error_;
}

void OperationQueue::arm_idle_hook() {
  {
    std::lock_guard lock(mutex_);
    if (idle_armed_ || !idle_hook_) return;
    idle_armed_ = true;
  }
  cv_.notify_one();
}

bool OperationQueue::idle() {
  std::lock_guard lock(live_mutex_);
  return live_ops_ == 0;
}

bool OperationQueue::wait_finished(Operation& op, WaitMode mode) {
  // A small operation usually finishes within microseconds: poll before sleeping. The finishing
  // thread still holds a reference to `op` while it notifies, so returning here is safe.
  if (spin_until(completion_spin_limit(op.length), [&] { return op.finished(); })) {
    return true;
  }
  std::unique_lock lock(op.mutex);
  return wait_ready(
      op.finished_cv, lock, [&] { return op.finished(); }, mode);
}

void OperationQueue::stop() {
  {
    std::unique_lock lock(live_mutex_);
    live_cv_.wait(lock, [&] { return live_ops_ == 0; });
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
}

bool OperationQueue::should_exit() {
  std::lock_guard lock(mutex_);
  return stopping_ && queue_.empty();
}

}  // namespace nvio::detail
