// The handle's asynchronous tickets: what one ticket stands for (a Job: one operation, or the
// operations of a batch), and the table of the tickets outstanding, with the waits that collect
// them. Internal to the library.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/interrupt.hpp"
#include "core/pool.hpp"
#include "handle/operation.hpp"
#include "nvio/handle.hpp"

namespace nvio::detail {

// What one ticket stands for: one operation, or the operations of a batch in extent order.
// Immutable once made; each operation's outcome is guarded by its own mutex.
struct Job {
  // A single operation's vector holds one element: a pooled block (core/pool.hpp).
  std::vector<OperationPtr, PoolAllocator<OperationPtr>> ops;
  Ticket ticket = 0;                       // 0 for a blocking call's
  std::atomic<std::size_t> unfinished{0};  // operations not finished yet (asynchronous jobs)
  // A job of no operations (an empty batch): when it was registered, which is when it finished.
  std::chrono::steady_clock::time_point empty_finished_at;

  // Waits for every operation: true. An Interruptible wait returns false when the thread's
  // InterruptCheck said to stop (core/interrupt.hpp); the operations go on.
  bool wait(WaitMode mode = WaitMode::Uninterruptible) const;
  bool done() const;
  // After wait(): when the last of its operations finished.
  std::chrono::steady_clock::time_point finished_at() const;
  // After wait(): the first failure in extent order, or null.
  std::exception_ptr error() const;
  // The sum of its operations' lengths.
  std::uint64_t bytes() const;
};
using JobPtr = std::shared_ptr<Job>;

JobPtr make_job();
JobPtr single(OperationPtr op);

// The tickets of a handle's asynchronous jobs, from registration until a wait collects them
// (see the rule in handle.hpp: a ticket is collected once, and a wait for all also waits for the
// jobs other threads' waits are collecting). It is the listener of its jobs' operations: a job's
// last operation lists its ticket as finished, for wait_some. Thread-safe: one mutex guards the
// tables; the waits for operations run outside it. Outlives every operation registered with it
// (the handle stops its queue, which waits for every live operation, before the table goes).
class TicketTable final : public FinishListener {
 public:
  // Gives `job` its ticket and makes the table its operations' listener; a job of no operations
  // is listed as finished at once. The caller queues the operations afterwards.
  Ticket add(const JobPtr& job);
  // wait(ticket): collects `ticket` and waits for it (Interrupted, the ticket outstanding again,
  // when the thread's InterruptCheck said to stop). InvalidArgument for an unknown ticket.
  Completion wait(Ticket ticket);
  // Handle::wait_some.
  std::size_t wait_some(std::span<Completion> out, std::size_t min_count);
  // Handle::wait(): collects every outstanding ticket and waits for those and for the ones other
  // threads' waits are collecting; throws the first failure after all have finished.
  std::size_t wait_all();
  // The job of `ticket`, outstanding or being collected by another thread's wait (Handle::cancel);
  // InvalidArgument when there is none.
  JobPtr find_cancellable(Ticket ticket) const;
  bool done(Ticket ticket) const;
  bool is_pending(Ticket ticket) const;
  std::size_t pending() const;

  // A job's last operation finished: its ticket joins `finished_` for wait_some.
  bool operation_finished(const Operation& op) noexcept override;
  void wake_collectors() noexcept override;

 private:
  // The job behind `ticket` (InvalidArgument when there is none). collect(): a wait takes it: it
  // moves from the table to `collecting_` until the wait calls end_collect.
  JobPtr find(Ticket ticket) const;
  JobPtr collect(Ticket ticket);
  void end_collect(std::span<const JobPtr> jobs);
  // An interrupted wait gives back the jobs it took: they are outstanding again, and listed in
  // `finished_` again when they have finished (a wait_some may have taken them from there).
  void uncollect(std::span<const JobPtr> jobs);
  // Adds `ticket` to `finished_` (pruning collected ones). Called with mutex_ held; the caller
  // notifies finished_cv_ after letting it go.
  void list_finished(Ticket ticket) noexcept;
  // Reserves room in `finished_` for every ticket to finish without growing it in
  // operation_finished, which must not throw. Called with mutex_ held.
  void reserve_finished();

  mutable std::mutex mutex_;
  std::map<Ticket, JobPtr, std::less<>, PoolAllocator<std::pair<const Ticket, JobPtr>>> tickets_;
  // Jobs a wait has taken from `tickets_` and is waiting for: a concurrent wait() must still wait
  // for them (see the rule in handle.hpp). Guarded by mutex_.
  std::map<const Job*, JobPtr, std::less<>, PoolAllocator<std::pair<const Job* const, JobPtr>>>
      collecting_;
  Ticket next_ticket_ = 1;
  // Tickets whose job finished, in the order they did, for wait_some; entries that another wait
  // collected meanwhile are skipped (and pruned). Guarded by mutex_; finished_cv_ is notified
  // when one is added.
  std::vector<Ticket> finished_;
  std::condition_variable finished_cv_;
  std::atomic<std::uint64_t> finished_count_{0};  // jobs finished so far: wait_some polls it
};

}  // namespace nvio::detail
