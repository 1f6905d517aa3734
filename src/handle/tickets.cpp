#include "handle/tickets.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/spin.hpp"
#include "nvio/errors.hpp"

namespace nvio::detail {

bool Job::wait(WaitMode mode) const {
  for (const OperationPtr& op : ops) {
    // A batch of small extents is many short waits: the check is asked between them too.
    if (interrupt_overdue(mode) || !OperationQueue::wait_finished(*op, mode)) return false;
  }
  return true;
}

bool Job::done() const {
  for (const OperationPtr& op : ops) {
    if (!op->finished()) return false;
  }
  return true;
}

std::chrono::steady_clock::time_point Job::finished_at() const {
  if (ops.empty()) return empty_finished_at;
  std::chrono::steady_clock::time_point last;
  for (const OperationPtr& op : ops) last = std::max(last, op->finished_at);
  return last;
}

std::exception_ptr Job::error() const {
  for (const OperationPtr& op : ops) {
    if (op->error) return op->error;
  }
  return nullptr;
}

std::uint64_t Job::bytes() const {
  std::uint64_t total = 0;
  for (const OperationPtr& op : ops) total += op->length;
  return total;
}

JobPtr make_job() { return std::allocate_shared<Job>(PoolAllocator<Job>{}); }

JobPtr single(OperationPtr op) {
  JobPtr job = make_job();
  job->ops.push_back(std::move(op));
  return job;
}

void TicketTable::reserve_finished() {
  // Below 2 * tickets + 64 entries `finished_` is not pruned, then it holds at most the live
  // tickets.
  const std::size_t room = 2 * tickets_.size() + 65;
  if (finished_.capacity() < room) finished_.reserve(std::max(room, 2 * finished_.capacity()));
}

Ticket TicketTable::add(const JobPtr& job) {
  Ticket t;
  job->unfinished.store(job->ops.size(), std::memory_order_relaxed);
  if (job->ops.empty()) job->empty_finished_at = std::chrono::steady_clock::now();
  for (const OperationPtr& op : job->ops) {
    op->listener = this;
    op->job = job.get();
  }
  {
    std::lock_guard lock(mutex_);
    t = next_ticket_++;
    job->ticket = t;
    tickets_.emplace(t, job);
    reserve_finished();
    // A job of no operations (an empty batch) has finished already: no operation will say so.
    if (job->ops.empty()) list_finished(t);
  }
  if (job->ops.empty()) finished_cv_.notify_all();
  return t;
}

void TicketTable::list_finished(Ticket ticket) noexcept {
  if (finished_.size() >= 2 * tickets_.size() + 64) {
    // Mostly tickets that wait() or wait(ticket) collected: drop those.
    std::erase_if(finished_, [&](Ticket t) { return !tickets_.contains(t); });
  }
  finished_.push_back(ticket);  // within the capacity reserve_finished made
  finished_count_.fetch_add(1, std::memory_order_release);
}

bool TicketTable::operation_finished(const Operation& op) noexcept {
  auto* job = static_cast<Job*>(op.job);
  if (job->unfinished.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  std::lock_guard lock(mutex_);
  list_finished(job->ticket);
  return true;
}

void TicketTable::wake_collectors() noexcept { finished_cv_.notify_all(); }

namespace {

[[noreturn]] void unknown_ticket(Ticket ticket) {
  throw InvalidArgument(fmt::format("ticket {} is unknown or was already waited for", ticket));
}

}  // namespace

JobPtr TicketTable::find(Ticket ticket) const {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) unknown_ticket(ticket);
  return it->second;
}

JobPtr TicketTable::collect(Ticket ticket) {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) unknown_ticket(ticket);
  JobPtr job = std::move(it->second);
  tickets_.erase(it);
  collecting_.emplace(job.get(), job);
  return job;
}

void TicketTable::end_collect(std::span<const JobPtr> jobs) {
  std::lock_guard lock(mutex_);
  for (const JobPtr& job : jobs) collecting_.erase(job.get());
}

void TicketTable::uncollect(std::span<const JobPtr> jobs) {
  bool listed = false;
  {
    std::lock_guard lock(mutex_);
    for (const JobPtr& job : jobs) {
      collecting_.erase(job.get());
      tickets_.emplace(job->ticket, job);
      // Kept within what add() reserves, for operation_finished's list_finished.
      reserve_finished();
      // A job still unfinished is listed by its last operation. One that has finished is
      // listed again unless its entry is still there (a wait_some takes entries out): listed
      // twice, it would be collected once all the same, but every interrupted wait would add a
      // copy beyond the room reserved above.
      if (job->unfinished.load(std::memory_order_acquire) == 0 &&
          std::find(finished_.begin(), finished_.end(), job->ticket) == finished_.end()) {
        list_finished(job->ticket);
        listed = true;
      }
    }
  }
  if (listed) finished_cv_.notify_all();
}

Completion TicketTable::wait(Ticket ticket) {
  JobPtr job = collect(ticket);
  if (!job->wait(WaitMode::Interruptible)) {
    uncollect(std::span(&job, 1));
    throw Interrupted(fmt::format(
        "interrupted: the wait for ticket {} stopped; the ticket is still outstanding", ticket));
  }
  end_collect(std::span(&job, 1));
  return Completion{ticket, job->error(), job->finished_at()};
}

namespace {

// wait_some polls before sleeping only while at most this many operations are outstanding.
constexpr std::size_t kPollOutstanding = 2;

}  // namespace

std::size_t TicketTable::wait_some(std::span<Completion> out, std::size_t min_count) {
  std::vector<JobPtr> mine;
  {
    std::unique_lock lock(mutex_);
    for (;;) {
      // The entries looked at are removed before the lock is let go (operation_finished prunes
      // the list, which would move them).
      std::size_t next = 0;
      for (; next < finished_.size() && mine.size() < out.size(); ++next) {
        auto it = tickets_.find(finished_[next]);
        if (it == tickets_.end()) continue;  // collected by another wait
        collecting_.emplace(it->second.get(), it->second);
        mine.push_back(std::move(it->second));
        tickets_.erase(it);
      }
      finished_.erase(finished_.begin(), finished_.begin() + static_cast<std::ptrdiff_t>(next));
      // Fewer than asked for can only come when no more are outstanding.
      const std::size_t want = std::min({min_count, out.size(), mine.size() + tickets_.size()});
      if (mine.size() >= want) break;
      // With one or two operations outstanding the caller waits for each in turn: poll before
      // sleeping (core/spin.hpp), as a small one finishes within microseconds. With more, one
      // finishes soon anyway, and polling would take a CPU from the kernel's side of the I/O.
      if (tickets_.size() <= kPollOutstanding) {
        std::uint64_t bytes = 0;  // of the one or two jobs outstanding (the table needs the lock)
        for (const auto& [ticket, job] : tickets_) bytes += job->bytes();
        const std::uint64_t seen = finished_count_.load(std::memory_order_acquire);
        lock.unlock();
        const bool more = spin_until(completion_spin_limit(bytes), [&] {
          return finished_count_.load(std::memory_order_acquire) != seen;
        });
        lock.lock();
        if (more || finished_count_.load(std::memory_order_acquire) != seen) continue;
      }
      const std::uint64_t seen = finished_count_.load(std::memory_order_acquire);
      if (!wait_ready(
              finished_cv_, lock,
              [&] { return finished_count_.load(std::memory_order_acquire) != seen; },
              WaitMode::Interruptible)) {
        lock.unlock();
        uncollect(mine);
        throw Interrupted(
            "interrupted: wait_some stopped; every ticket it had not returned is still "
            "outstanding");
      }
    }
  }
  // Their last operation is finishing (its listener ran): wait() covers the last few steps.
  for (std::size_t i = 0; i < mine.size(); ++i) {
    mine[i]->wait();
    out[i] = Completion{mine[i]->ticket, mine[i]->error(), mine[i]->finished_at()};
  }
  end_collect(mine);
  return mine.size();
}

std::size_t TicketTable::wait_all() {
  std::vector<JobPtr> mine;    // collected by this wait: counted here
  std::vector<JobPtr> others;  // being collected by another thread's wait right now
  {
    std::lock_guard lock(mutex_);
    for (const auto& [job, ptr] : collecting_) others.push_back(ptr);
    for (auto& [ticket, job] : tickets_) {
      collecting_.emplace(job.get(), job);
      mine.push_back(std::move(job));
    }
    tickets_.clear();
  }
  const auto all_finished = [](const std::vector<JobPtr>& jobs) {
    for (const JobPtr& job : jobs) {
      if (!job->wait(WaitMode::Interruptible)) return false;
    }
    return true;
  };
  if (!all_finished(mine) || !all_finished(others)) {
    uncollect(mine);
    throw Interrupted(
        "interrupted: wait() stopped; the tickets it had not returned are still outstanding");
  }
  end_collect(mine);
  // Every operation has been waited for; the first failure is the one reported, this wait's own
  // operations first.
  for (const auto* list : {&mine, &others}) {
    for (const JobPtr& job : *list) {
      if (std::exception_ptr e = job->error()) std::rethrow_exception(e);
    }
  }
  return mine.size();
}

JobPtr TicketTable::find_cancellable(Ticket ticket) const {
  JobPtr job;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tickets_.find(ticket); it != tickets_.end()) {
      job = it->second;
    } else {
      // A ticket another thread is waiting for can be cancelled too: that wait then returns.
      for (const auto& [key, ptr] : collecting_) {
        if (ptr->ticket == ticket) job = ptr;
      }
    }
  }
  if (!job) {
    throw InvalidArgument(
        fmt::format("cancel: ticket {} is unknown or was already waited for", ticket));
  }
  return job;
}

bool TicketTable::done(Ticket ticket) const { return find(ticket)->done(); }

bool TicketTable::is_pending(Ticket ticket) const {
  std::lock_guard lock(mutex_);
  return tickets_.contains(ticket);
}

std::size_t TicketTable::pending() const {
  std::lock_guard lock(mutex_);
  return tickets_.size();
}

}  // namespace nvio::detail
