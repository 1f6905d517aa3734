#include "cuda/device_lane.hpp"

#include <fmt/format.h>

#include "nvio/errors.hpp"
#include "nvio/warnings.hpp"

namespace nvio::cuda {

DeviceLane::DeviceLane(std::shared_ptr<DeviceOps> ops, unsigned slots, detail::BouncePool& pool)
    : ops_(std::move(ops)), pool_(pool), events_(slots), event_device_(slots, -1) {
  pool_.on_slab([this](std::byte* slab, std::size_t bytes) {
    // cuMemHostRegister needs a context current on the calling thread (without one it fails with
    // CUDA_ERROR_INVALID_CONTEXT, as it did on a real GPU): a slab taken before this worker's
    // first copy meets a thread with none. Any device's will do, since the registration is
    // portable; device 0 always exists where a device does.
    int rc = kSuccess;
    if (current_ < 0) {
      rc = ops_->make_current(0);
      if (rc == kSuccess) current_ = 0;
    }
    Registration reg;
    if (rc == kSuccess) reg = Registration(*ops_, slab, bytes, rc);
    if (rc == kSuccess) {
      registrations_.push_back(std::move(reg));
    } else {
      // Copies from pageable memory still work (the driver stages them), only slower.
      warn(fmt::format("cuMemHostRegister of a {}-byte bounce slab failed ({}: {}); device "
                       "copies use pageable memory and are slower",
                       bytes, ops_->error_name(rc), ops_->error_string(rc)),
           "host-register");
    }
  });
}

DeviceLane::~DeviceLane() {
  // The worker has no copy in flight when it drops its lane (or has abandoned the memory), but a
  // stream must be idle before the memory its copies touched is unregistered.
  for (auto& e : events_) {
    if (e.get() != nullptr) ops_->event_synchronize(e.get());
  }
  // The hook points at this lane: a later slab must not call into a destroyed one.
  pool_.on_slab({});
}

void* DeviceLane::stream_for(int device) {
  if (device != current_) {
    const int rc = ops_->make_current(device);
    if (rc != kSuccess) throw_gpu_error(*ops_, "cuCtxSetCurrent", rc);
    current_ = device;
  }
  auto it = streams_.find(device);
  if (it == streams_.end()) it = streams_.emplace(device, Stream(*ops_)).first;
  return it->second.get();
}

void* DeviceLane::event_for(unsigned slot, int device) {
  if (event_device_[slot] != device) {
    events_[slot] = Event(*ops_);
    event_device_[slot] = device;
  }
  return events_[slot].get();
}

DeviceLane::Started DeviceLane::start_copy(unsigned slot, int device, void* dst, const void* src,
                                           std::size_t length, bool to_device, int& code,
                                           const char*& api) {
  void* stream = stream_for(device);
  void* event = event_for(slot, device);
  code = to_device ? ops_->copy_to_device_async(dst, src, length, stream)
                   : ops_->copy_to_host_async(dst, src, length, stream);
  if (code != kSuccess) {
    api = to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
    return Started::Failed;  // refused: nothing was queued
  }
  code = ops_->event_record(event, stream);
  if (code == kSuccess) return Started::Recorded;
  // The copy is queued but nothing will say when it is done: wait for the whole stream, so that
  // its memory is not reused while the copy still runs.
  api = "cuEventRecord";
  return ops_->stream_synchronize(stream) == kSuccess ? Started::Failed : Started::InDoubt;
}

}  // namespace nvio::cuda
