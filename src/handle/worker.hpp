// A handle's worker thread: takes pieces from the handle's queue and moves each through its own
// slot of an explicit state machine, with up to queue_depth in flight on the worker's engine.
// Internal to the library.
#pragma once

#include <cstddef>
#include <future>
#include <memory>

#include "handle/operation.hpp"
#include "nvio/options.hpp"

namespace nvio::detail {

struct WorkerSettings {
  unsigned index = 0;  // from 0, for messages
  unsigned queue_depth = 1;
  unsigned intra_op_parallelism = 1;
  std::size_t block_size = 0;
  bool overlap_events = true;
  bool single_submit = false;
  EngineKind engine = EngineKind::Psync;  // concrete
  StatsShard* stats = nullptr;            // this worker's counters; outlives the worker
  // Driven by its caller (DrivenWorker) rather than run by a thread of its own.
  bool caller_driven = false;
};

namespace worker_impl {
class Worker;
}

// A worker without a thread of its own, for the caller-driven path (handle/caller_lane.hpp): the
// same slots, state machine and engine as a worker thread's, run by the thread that queued the
// pieces. Made on the thread that drives it (its engine, an io_uring ring made with
// SINGLE_ISSUER, takes submissions from that thread only). `settings.caller_driven` must be set.
class DrivenWorker {
 public:
  // Makes the engine and buffers; throws when it cannot (as a worker thread's start would).
  DrivenWorker(const WorkerSettings& settings, OperationQueue& queue);
  ~DrivenWorker();
  DrivenWorker(const DrivenWorker&) = delete;
  DrivenWorker& operator=(const DrivenWorker&) = delete;
  // Runs the pieces of `queue` on the calling thread until none is queued or in flight. Never
  // throws: a failure it cannot attribute to one operation stops it as it stops a worker thread
  // (queue.worker_died()), after which it must not be driven again.
  void drive() noexcept;

 private:
  std::unique_ptr<worker_impl::Worker> worker_;
};

// The body of a worker thread. Makes the worker's engine and buffers and reports the outcome
// through `ready` (an exception when they cannot be made), then runs pieces of `queue` until
// queue.should_exit() with nothing in flight. Never throws: a failure it cannot attribute to one
// operation stops the worker and is recorded with queue.worker_died().
void run_worker(const WorkerSettings& settings, OperationQueue& queue, std::promise<void> ready);

}  // namespace nvio::detail
