// A handle's worker thread: takes pieces from the handle's queue and moves each through its own
// slot of an explicit state machine, with up to queue_depth in flight on the worker's engine.
// Internal to the library.
#pragma once

#include <cstddef>
#include <future>

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
};

// The body of a worker thread. Makes the worker's engine and buffers and reports the outcome
// through `ready` (an exception when they cannot be made), then runs pieces of `queue` until
// queue.should_exit() with nothing in flight. Never throws: a failure it cannot attribute to one
// operation stops the worker and is recorded with queue.worker_died().
void run_worker(const WorkerSettings& settings, OperationQueue& queue, std::promise<void> ready);

}  // namespace nvio::detail
