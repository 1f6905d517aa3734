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
  // The caller lane's worker (CallerWorker): driven by calling threads in turn, it never waits
  // for work and its engine accepts requests from any thread.
  bool caller_lane = false;
};

// The body of a worker thread. Makes the worker's engine and buffers and reports the outcome
// through `ready` (an exception when they cannot be made), then runs pieces of `queue` until
// queue.should_exit() with nothing in flight. Never throws: a failure it cannot attribute to one
// operation stops the worker and is recorded with queue.worker_died().
void run_worker(const WorkerSettings& settings, OperationQueue& queue, std::promise<void> ready);

// The worker's state machine without a thread of its own: the handle's calling threads drive it,
// one at a time, for small direct requests (handle.cpp, "the caller lane"), so that such a request
// is submitted and reaped by the thread that wants it, as fio does, instead of being handed to a
// worker thread and back (two wake-ups per request). Its requests go to an engine of its own,
// which proceeds while no thread drives (completes_in_background()).
//
// Thread-safety: none; the handle lets one thread at a time call any member but the constructor.
class CallerWorker {
 public:
  // Makes the engine and slots (settings.caller_lane is set here). Throws as a worker's
  // constructor does when they cannot be made.
  explicit CallerWorker(WorkerSettings settings);
  ~CallerWorker();
  CallerWorker(const CallerWorker&) = delete;
  CallerWorker& operator=(const CallerWorker&) = delete;

  // Whether its engine's requests proceed while no thread drives it: when not, the handle must
  // not use it (a psync engine would transfer inside submit(), on the caller's thread).
  bool completes_in_background() const noexcept { return background_; }
  // False once an unexpected exception stopped it (its operations then failed): the handle
  // sends everything to the worker threads from then on.
  bool alive() const noexcept { return alive_; }
  // A slot is free for one more piece.
  bool has_room() const noexcept;
  // Starts `op` (one piece, no bounce chunk) and submits it with whatever else is due.
  void submit(const OperationPtr& op, StatsShard& stats);
  // Reaps what has completed and submits what is due; with `block`, waits for at least one
  // completion while requests are in flight. Finishes the operations whose pieces completed, on
  // the calling thread.
  void turn(bool block) noexcept;
  // Operations given to it and not yet finished (started, or waiting for a slot).
  std::size_t in_flight() noexcept;

 private:
  OperationQueue queue_;  // the lane's own: only its operations
  struct State;
  std::unique_ptr<State> state_;
  bool background_ = false;
  bool alive_ = true;
};

}  // namespace nvio::detail
