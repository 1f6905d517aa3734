// A fake CUDA device for tests of the device path on machines without a GPU: "device memory" is
// host memory it hands out, and copies run later, in stream order, on a helper thread after small
// random delays, so events really complete after the calls that recorded them.
//
// It also checks how it is used: copies must name its device memory on the device side, streams
// and events must be used in the context of their device, and everything created must be
// destroyed (counters below). Errors can be injected into the n-th copy, either returned by the
// copy call itself or reported later through the event, as CUDA does for asynchronous failures.
//
// Thread-safety: all members may be called from any thread; one mutex guards the state, and the
// helper thread publishes completed work under it (so readers of copied bytes are ordered after
// the copy).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cuda/device_ops.hpp"

namespace nvio_test {

class FakeDevice final : public nvio::cuda::DeviceOps {
 public:
  static constexpr int kInvalidValue = 1;      // CUDA_ERROR_INVALID_VALUE
  static constexpr int kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
  static constexpr int kLaunchFailure = 719;   // CUDA_ERROR_LAUNCH_FAILED

  explicit FakeDevice(int device_count = 2, unsigned seed = 1);
  ~FakeDevice() override;

  // `length` bytes of fake device memory on `device`, alive as long as the FakeDevice.
  unsigned char* alloc(std::size_t length, int device = 0);

  // Makes the `nth` copy from now (1 = the next) fail with `code`: returned by the copy call
  // when `at_call`, else reported by the event recorded after it.
  void fail_copy(int nth, int code, bool at_call);
  // Makes the `nth` event record from now fail with `code` (the copy before it still runs), and
  // the `nth` check of an event that finds it done (event_query or event_synchronize) fail with
  // `code` (as a sticky context error reports). Each stream_synchronize fails with
  // `stream_sync_code` when it is non-zero.
  void fail_record(int nth, int code);
  void fail_event_sync(int nth, int code);
  void fail_stream_sync(int code);
  std::size_t stream_syncs() const;

  // What happened so far.
  std::size_t copies() const;
  std::size_t unregistered_copies() const;  // copies whose host side was not registered
  std::size_t max_pending() const;          // most copies queued at once
  std::size_t live_objects() const;         // streams + events + registrations not destroyed
  std::size_t misuse() const;               // wrong-context or out-of-range uses

  std::optional<int> device_of(const void* ptr) noexcept override;
  int make_current(int device) noexcept override;
  int host_register(void* ptr, std::size_t length) noexcept override;
  int host_unregister(void* ptr) noexcept override;
  int stream_create(void** stream) noexcept override;
  int stream_destroy(void* stream) noexcept override;
  int event_create(void** event) noexcept override;
  int event_destroy(void* event) noexcept override;
  int event_record(void* event, void* stream) noexcept override;
  int event_query(void* event) noexcept override;
  int event_synchronize(void* event) noexcept override;
  int stream_synchronize(void* stream) noexcept override;
  int copy_to_device_async(void* dst, const void* src, std::size_t length,
                           void* stream) noexcept override;
  int copy_to_host_async(void* dst, const void* src, std::size_t length,
                         void* stream) noexcept override;
  std::string error_name(int code) override;
  std::string error_string(int code) override;

 private:
  struct StreamState {
    int device;
    int pending_error = 0;  // an injected asynchronous failure not yet reported
  };
  struct EventState {
    int device;
    bool done = true;
    int error = 0;
  };
  struct Task {
    StreamState* stream;
    EventState* event;  // a record task when set, else a copy
    void* dst;
    const void* src;
    std::size_t length;
    int error;
  };

  int copy_async(void* dst, const void* src, std::size_t length, void* stream, bool to_device);
  bool is_device_range(const void* p, std::size_t n, int device) const;
  bool is_registered(const void* p, std::size_t n) const;
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  int device_count_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<unsigned char[]>> memory_;
  std::map<std::uintptr_t, std::pair<std::size_t, int>> device_ranges_;  // base -> length, device
  std::map<std::uintptr_t, std::size_t> registered_;
  std::map<StreamState*, std::unique_ptr<StreamState>> streams_;
  std::map<EventState*, std::unique_ptr<EventState>> events_;
  int fail_countdown_ = 0;
  int record_fail_countdown_ = 0;
  int record_fail_code_ = 0;
  int sync_fail_countdown_ = 0;
  int sync_fail_code_ = 0;
  int stream_sync_code_ = 0;
  std::size_t stream_syncs_ = 0;
  int fail_code_ = 0;
  bool fail_at_call_ = false;
  std::size_t copies_ = 0;
  std::size_t unregistered_copies_ = 0;
  std::size_t max_pending_ = 0;
  std::size_t misuse_ = 0;
  std::thread helper_;  // last: started after everything it uses exists
};

// Installs a FakeDevice as the device operations for its lifetime.
class ScopedFakeDevice {
 public:
  explicit ScopedFakeDevice(int device_count = 2, unsigned seed = 1);
  ~ScopedFakeDevice();
  ScopedFakeDevice(const ScopedFakeDevice&) = delete;
  ScopedFakeDevice& operator=(const ScopedFakeDevice&) = delete;
  FakeDevice& operator*() const { return *fake_; }
  FakeDevice* operator->() const { return fake_.get(); }

 private:
  std::shared_ptr<FakeDevice> fake_;
  std::shared_ptr<nvio::cuda::DeviceOps> previous_;
};

}  // namespace nvio_test
