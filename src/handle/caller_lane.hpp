// The caller-driven path (issue 32 item 6): a small blocking operation, queued while the handle's
// workers have nothing to do, is run by the calling thread itself instead of being handed to a
// worker thread and back (a futex wake and a context switch each way, tens of microseconds in a
// VM, against a 4 KiB read's one or two from the page cache).
//
// Each thread that makes such calls gets a lane of its own: a private OperationQueue and a
// DrivenWorker (handle/worker.hpp), the same slots, state machine, retry rules, counting and
// errors as a worker thread's, on an engine of the handle's kind made on and used by that thread
// only (an io_uring ring with SINGLE_ISSUER and COOP_TASKRUN is safe there: the thread that
// submits is the one that reaps, until nothing is in flight). The caller queues its operation
// there and drives the lane until it has finished; the blocking call's wait then finds it done,
// and everything after (the interrupt question, errors, stats) is the worker path's.
//
// Taken only when: one operation of host memory of at most kMaxBytes, the handle's queue idle
// (its workers have nothing to do, so nothing queued before is overtaken and no worker's CPU is
// taken), and the thread's lane is usable. Anything else goes to the workers. An interrupt
// (InterruptCheck) is asked after the lane has run, as it is of a blocking call whose pieces all
// started: the call's outcome is reported.
// Internal to the library.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "handle/operation.hpp"
#include "handle/tickets.hpp"
#include "handle/worker.hpp"

namespace nvio::detail {

class CallerLanes {
 public:
  // Lanes for at most this many threads at once; a thread that finds none left uses the workers.
  static constexpr unsigned kMaxLanes = 8;
  // The largest operation taken (bytes): beyond it the transfer outweighs the hand-off, and a
  // worker thread overlaps its pieces with the caller's next work.
  static constexpr std::size_t kMaxBytes = std::size_t{64} << 10;

  // `base`: the settings of the handle's workers; `shards`: kMaxLanes counters shards, lane k
  // counting into shards[k]. With `enabled` false no lane is ever made.
  CallerLanes(const WorkerSettings& base, StatsShard* shards, bool enabled);
  ~CallerLanes();
  CallerLanes(const CallerLanes&) = delete;
  CallerLanes& operator=(const CallerLanes&) = delete;

  struct Lane;
  // The use of the calling thread's lane by one blocking call; empty when the call goes to the
  // workers.
  class Lease {
   public:
    Lease() = default;
    explicit Lease(Lane* lane) : lane_(lane) {}
    Lease(Lease&& other) noexcept : lane_(other.lane_) { other.lane_ = nullptr; }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    explicit operator bool() const noexcept { return lane_ != nullptr; }
    // The lane's queue: the call's operation is pushed there.
    OperationQueue& queue() const;
    // Runs what was pushed until it has finished (never throws).
    void drive() const noexcept;

   private:
    Lane* lane_ = nullptr;
  };

  // The calling thread's lane for `job` when the caller-driven path applies (see above), made on
  // first use; an empty lease otherwise.
  Lease lease(const Job& job, OperationQueue& handle_queue);

 private:
  Lane* lane_of_this_thread();

  WorkerSettings base_;
  StatsShard* shards_;
  bool enabled_;
  std::mutex mutex_;  // guards lanes_
  std::array<std::unique_ptr<Lane>, kMaxLanes> lanes_;
};

// Whether the handle's blocking calls may take the caller-driven path: true unless the
// environment variable NVIO_CALLER_DRIVEN is "off" or "0" (for measuring the two paths against
// each other; bench/small_reads.cpp, bench/file_python.py).
bool caller_driven_enabled() noexcept;

}  // namespace nvio::detail
