// The worker's bounce lane: the copies between the caller's memory and bounce chunks. A host
// copy is made by the worker thread, one chunk per turn of its loop (Worker::run); a device copy
// runs on a CUDA stream, and its event says when the chunk may be used (see handle/worker_impl.hpp
// and the invariants at the top of worker.cpp).
#include <fmt/format.h>

#include "handle/worker_impl.hpp"

namespace nvio::detail::worker_impl {
namespace {

std::exception_ptr gpu_error_ptr(cuda::DeviceOps& ops, const char* api, int code,
                                 const std::string& path, std::uint64_t offset,
                                 std::uint64_t length) {
  try {
    cuda::throw_gpu_error(ops, api, code, path, offset, length);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

void Worker::quarantine(unsigned i, std::exception_ptr error) {
  slots_[i].bounce = nullptr;  // never back to the pool
  ++quarantined_;
  retire_failed(i, std::move(error));
  if (quarantined_ >= memory_->pool.max_count()) {
    // No chunk is left for bounced pieces, which would then wait for ever: stop instead.
    throw GpuError("cuStreamSynchronize", -1, "",
                   "every bounce chunk of this worker may still be in use by a device copy that "
                   "could not be waited for");
  }
}

void Worker::queue_host_copy(unsigned i, SlotState state) {
  slots_[i].state = state;
  host_copies_.push_back(i);
}

void Worker::copy_next_host() {
  const unsigned i = host_copies_.front();
  host_copies_.erase(host_copies_.begin());  // at most queue_depth entries: a short move
  Slot& s = slots_[i];
  if (s.op->failed()) {
    retire(i);  // the operation failed meanwhile: its bytes no longer matter
    return;
  }
  const bool write = s.state == SlotState::CopyingIn;
  if (!copy_host(i)) return;
  if (write) {
    make_ready(i);
  } else {
    retire(i);
  }
}

bool Worker::copy_host(unsigned i) {
  Slot& s = slots_[i];
  const bool read = s.op->is_read();
  const UserCopyResult r = read ? copier_.to_user(s.user, s.bounce, s.length)
                                : copier_.from_user(s.bounce, s.user, s.length);
  if (r.error == 0) return true;
  // Memory the caller cannot access fails the operation with EFAULT, as the kernel does with
  // such a buffer.
  const void* where = s.user + r.fault_at;
  retire_failed(
      i, io_error_ptr(
             io_op(s), s.op->path, s.file_offset + r.fault_at, s.length - r.fault_at, r.error,
             fmt::format("copying {} the caller's buffer at {} ({})", read ? "into" : "out of",
                         where, read ? "is it writable?" : "is it readable?")));
  return false;
}

void Worker::start_copy(unsigned i, bool to_device) {
  Slot& s = slots_[i];
  Operation& op = *s.op;
  cuda::DeviceLane& lane = *memory_->lane;
  int code = cuda::kSuccess;
  const char* api = "";
  cuda::DeviceLane::Started started;
  try {
    started = to_device
                  ? lane.start_copy(i, op.device, s.user, s.bounce, s.length, true, code, api)
                  : lane.start_copy(i, op.device, s.bounce, s.user, s.length, false, code, api);
  } catch (...) {  // nothing was queued
    retire_failed(i, std::current_exception());
    return;
  }
  switch (started) {
    case cuda::DeviceLane::Started::Recorded:
      s.state = to_device ? SlotState::CopyingOut : SlotState::CopyingIn;
      copying_.push_back(i);
      return;
    case cuda::DeviceLane::Started::Failed:
      retire_failed(i, gpu_error_ptr(lane.ops(), api, code, op.path, s.file_offset, s.length));
      return;
    case cuda::DeviceLane::Started::InDoubt:
      quarantine(i, gpu_error_ptr(lane.ops(), api, code, op.path, s.file_offset, s.length));
      return;
  }
}

std::size_t Worker::poll_copies(bool block_on_oldest) {
  cuda::DeviceLane& lane = *memory_->lane;
  std::size_t progressed = 0;
  for (std::size_t k = 0; k < copying_.size();) {
    const unsigned i = copying_[k];
    const bool block = block_on_oldest && progressed == 0 && k == 0;
    const int rc =
        block ? lane.ops().event_synchronize(lane.event(i)) : lane.ops().event_query(lane.event(i));
    if (rc == cuda::kNotReady) {
      ++k;
      continue;
    }
    ++progressed;
    copying_.erase(copying_.begin() + static_cast<std::ptrdiff_t>(k));
    Slot& s = slots_[i];
    const bool to_device = s.state == SlotState::CopyingOut;
    if (rc != cuda::kSuccess) {
      // The event reports the copy's failure (CUDA reports asynchronous errors through the next
      // synchronising call) once the work before it has ended: the chunk is no longer in use.
      retire_failed(
          i, gpu_error_ptr(lane.ops(), to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", rc,
                           s.op->path, s.file_offset, s.length));
      continue;
    }
    if (to_device) {
      retire(i);
    } else {
      make_ready(i);  // the chunk holds the data: write it
    }
  }
  return progressed;
}

}  // namespace nvio::detail::worker_impl
