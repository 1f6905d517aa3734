// The device operations the handle's workers use, behind a small interface so that the pipelined
// device path runs (and is tested) without a GPU: the real implementation is the dlopen'ed CUDA
// driver; tests install a fake (host memory standing in for device memory, copies completed later
// on a helper thread) through set_device_ops_for_testing().
//
// Codes are CUresult values (0 success, kNotReady from event_query while pending). Streams and
// events are opaque handles owned by whoever created them; Stream/Event below destroy them.
// Thread-safety: implementations must allow concurrent calls from several workers; a stream and
// its events are used by one worker thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace nvio::cuda {

inline constexpr int kSuccess = 0;
inline constexpr int kNotReady = 600;  // CUDA_ERROR_NOT_READY

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // The device ordinal owning `ptr` when it is device (or managed) memory; nullopt for host
  // memory or when CUDA cannot tell.
  virtual std::optional<int> device_of(const void* ptr) noexcept = 0;
  // Makes `device`'s primary context current on the calling thread.
  virtual int make_current(int device) noexcept = 0;
  // Page-locks host memory for every context (portable). Both need some context current on the
  // calling thread, as the driver does: CUDA_ERROR_INVALID_CONTEXT (201) without one.
  virtual int host_register(void* ptr, std::size_t length) noexcept = 0;
  virtual int host_unregister(void* ptr) noexcept = 0;
  virtual int stream_create(void** stream) noexcept = 0;
  virtual int stream_destroy(void* stream) noexcept = 0;
  virtual int event_create(void** event) noexcept = 0;
  virtual int event_destroy(void* event) noexcept = 0;
  virtual int event_record(void* event, void* stream) noexcept = 0;
  // kSuccess once the work recorded before the event is done, kNotReady before, else an error.
  virtual int event_query(void* event) noexcept = 0;
  virtual int event_synchronize(void* event) noexcept = 0;
  // Waits until everything queued on `stream` is done (cuStreamSynchronize).
  virtual int stream_synchronize(void* stream) noexcept = 0;
  virtual int copy_to_device_async(void* dst, const void* src, std::size_t length,
                                   void* stream) noexcept = 0;
  virtual int copy_to_host_async(void* dst, const void* src, std::size_t length,
                                 void* stream) noexcept = 0;
  // "CUDA_ERROR_INVALID_VALUE" and "invalid argument" for a code.
  virtual std::string error_name(int code) = 0;
  virtual std::string error_string(int code) = 0;
};

// The operations in use: the test override when one is installed, else the CUDA driver. Throws
// GpuError (naming why, e.g. the dlopen error) when the driver cannot be used.
std::shared_ptr<DeviceOps> device_ops();
// Installs `ops` for tests (null restores the driver) and returns the previous override. Handles
// keep the ops they started with until they are destroyed.
std::shared_ptr<DeviceOps> set_device_ops_for_testing(std::shared_ptr<DeviceOps> ops);
// The test override, or null.
std::shared_ptr<DeviceOps> device_ops_override();

// Throws the GpuError for `code` returned by `api`, with the error's name and text.
[[noreturn]] void throw_gpu_error(DeviceOps& ops, const char* api, int code,
                                  const std::string& path = {}, std::uint64_t offset = 0,
                                  std::uint64_t length = 0);

// RAII owner of one stream or event of `ops` (move-only): the two differ only in which create and
// destroy calls they make.
enum class HandleKind { Stream, Event };

template <HandleKind Kind>
class OwnedHandle {
 public:
  OwnedHandle() = default;
  explicit OwnedHandle(DeviceOps& ops) : ops_(&ops) {  // throws GpuError
    const int rc =
        Kind == HandleKind::Stream ? ops.stream_create(&handle_) : ops.event_create(&handle_);
    if (rc != kSuccess) {
      handle_ = nullptr;
      throw_gpu_error(ops, Kind == HandleKind::Stream ? "cuStreamCreate" : "cuEventCreate", rc);
    }
  }
  ~OwnedHandle() { reset(); }
  OwnedHandle(OwnedHandle&& o) noexcept : ops_(o.ops_), handle_(o.handle_) { o.handle_ = nullptr; }
  OwnedHandle& operator=(OwnedHandle&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      handle_ = o.handle_;
      o.handle_ = nullptr;
    }
    return *this;
  }
  void* get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_ == nullptr) return;
    if (Kind == HandleKind::Stream) {
      ops_->stream_destroy(handle_);
    } else {
      ops_->event_destroy(handle_);
    }
    handle_ = nullptr;
  }
  DeviceOps* ops_ = nullptr;
  void* handle_ = nullptr;
};

using Stream = OwnedHandle<HandleKind::Stream>;
using Event = OwnedHandle<HandleKind::Event>;

// Keeps host memory registered (page-locked for DMA) with `ops` while it lives (move-only). A
// failed registration leaves it empty; the caller decides whether that matters.
class Registration {
 public:
  Registration() = default;
  Registration(DeviceOps& ops, void* ptr, std::size_t length, int& code) noexcept;
  ~Registration() { reset(); }
  Registration(Registration&& o) noexcept : ops_(o.ops_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  Registration& operator=(Registration&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }

 private:
  void reset() noexcept;
  DeviceOps* ops_ = nullptr;
  void* ptr_ = nullptr;
};

}  // namespace nvio::cuda
