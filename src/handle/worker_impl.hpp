// The worker's parts, shared by its files: the slot state machine's types and the Worker class.
// worker.cpp has the loop (taking pieces, submitting, reaping, completions, stopping);
// worker_copies.cpp the bounce lane (copies between the caller's memory and bounce chunks, on the
// worker thread for host memory and on CUDA streams for device memory). Internal to the library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "core/retry.hpp"
#include "cuda/device_lane.hpp"
#include "engine/engine.hpp"
#include "handle/files.hpp"
#include "handle/operation.hpp"
#include "handle/worker.hpp"
#include "memory/bounce_pool.hpp"
#include "memory/user_copy.hpp"

// Named, not anonymous: the Worker's member functions are defined in two files.
namespace nvio::detail::worker_impl {

// A worker's engines: the one of the handle's options, and engine::kDeviceDirectEngine for device
// memory that an engine moves itself (Operation::device_direct(); made when the worker first meets
// such an operation). The worker never asks which kinds they are.
enum Lane : unsigned { kHandleEngine = 0, kDeviceDirect = 1 };
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
  unsigned lane = kHandleEngine;  // the engine its requests go to
  std::byte* user = nullptr;    // the piece's bytes in the caller's buffer (a shifted read's: where
                                // they land, Operation::landing)
  std::byte* bounce = nullptr;  // the aligned copy used for I/O, or null for zero-copy
  int region = -1;              // the handle engine's region holding `bounce`, or -1
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
    engines[kHandleEngine] = std::move(e);
    held.reserve(slots);  // die() adds to it without allocating
  }
  std::array<std::unique_ptr<engine::Engine>, kLanes> engines;  // kDeviceDirect: null until needed
  BouncePool pool;
  std::unique_ptr<cuda::DeviceLane> lane;  // after `pool`: destroyed before it
  // The operations of requests left in an engine that could not be waited for (die()): a request
  // may point into memory its operation owns (a shifted read's tail buffer), kept with the rest.
  std::vector<OperationPtr> held;
};

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
  // The handle engine's region (Engine::add_region) of bounce chunk `chunk`, or -1.
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
  std::size_t on_disk() const { return on_disk_[kHandleEngine] + on_disk_[kDeviceDirect]; }
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
  std::vector<int> regions_;           // the handle engine's region of each slab of the pool, or -1
  bool watching_ = false;              // the handle's engine watches the queue's eventfd for us
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

}  // namespace nvio::detail::worker_impl
