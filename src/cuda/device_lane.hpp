// A worker's CUDA state for the bounce transport: a stream per device, an event per slot, and the
// registrations (page-locking) of its bounce pool's slabs. Made when the worker first meets device
// memory. Internal to the library.
//
// Ownership and thread-safety: owned by one worker thread and used only by it. It must be
// destroyed before the bounce pool whose slabs it registered; its destructor waits for its copies
// and removes its hook from the pool.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "cuda/device_ops.hpp"
#include "memory/bounce_pool.hpp"

namespace nvio::cuda {

class DeviceLane {
 public:
  // `slots`: how many events (one per worker slot). Registers `pool`'s slabs, now and later.
  DeviceLane(std::shared_ptr<DeviceOps> ops, unsigned slots, detail::BouncePool& pool);
  ~DeviceLane();
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  DeviceOps& ops() { return *ops_; }
  bool serves(const std::shared_ptr<DeviceOps>& ops) const { return ops == ops_; }

  // Makes `device` current on this thread and returns its stream. Throws GpuError.
  void* stream_for(int device);
  // The event of slot `slot`, created in `device`'s context (current). Throws GpuError.
  void* event_for(unsigned slot, int device);
  void* event(unsigned slot) const { return events_[slot].get(); }

  // Where a copy stands after start_copy().
  enum class Started {
    Recorded,  // the copy is queued and its slot's event recorded after it
    Failed,    // nothing is running: the copy was refused, or it finished (the stream was
               // synchronised) after its event could not be recorded
    InDoubt,   // the copy was queued, its event could not be recorded and the stream could not
               // be synchronised: the memory it uses must never be reused
  };
  // Queues an asynchronous copy of `length` bytes on `device`'s stream (to the device when
  // `to_device`) and records slot `slot`'s event after it. `code` and `api` say what failed.
  // Throws GpuError, with nothing queued, when the context, stream or event cannot be had.
  Started start_copy(unsigned slot, int device, void* dst, const void* src, std::size_t length,
                     bool to_device, int& code, const char*& api);

 private:
  std::shared_ptr<DeviceOps> ops_;
  detail::BouncePool& pool_;
  int current_ = -1;
  std::map<int, Stream> streams_;
  std::vector<Event> events_;
  std::vector<int> event_device_;
  std::vector<Registration> registrations_;
};

}  // namespace nvio::cuda
