#include "fake_device.hpp"

#include <chrono>
#include <cstring>
#include <string>

namespace nvio_test {
namespace {

thread_local int t_current_device = -1;

}  // namespace

FakeDevice::FakeDevice(int device_count, unsigned seed)
    : device_count_(device_count), rng_(seed), helper_([this] { run(); }) {}

FakeDevice::~FakeDevice() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  helper_.join();
}

unsigned char* FakeDevice::alloc(std::size_t length, int device) {
  std::lock_guard lock(mutex_);
  memory_.push_back(std::make_unique<unsigned char[]>(length == 0 ? 1 : length));
  unsigned char* p = memory_.back().get();
  device_ranges_[reinterpret_cast<std::uintptr_t>(p)] = {length, device};
  return p;
}

void FakeDevice::fail_copy(int nth, int code, bool at_call) {
  std::lock_guard lock(mutex_);
  fail_countdown_ = nth;
  fail_code_ = code;
  fail_at_call_ = at_call;
}

void FakeDevice::fail_record(int nth, int code) {
  std::lock_guard lock(mutex_);
  record_fail_countdown_ = nth;
  record_fail_code_ = code;
}

void FakeDevice::fail_event_sync(int nth, int code) {
  std::lock_guard lock(mutex_);
  sync_fail_countdown_ = nth;
  sync_fail_code_ = code;
}

void FakeDevice::fail_stream_sync(int code) {
  std::lock_guard lock(mutex_);
  stream_sync_code_ = code;
}

std::size_t FakeDevice::stream_syncs() const {
  std::lock_guard lock(mutex_);
  return stream_syncs_;
}

std::size_t FakeDevice::copies() const {
  std::lock_guard lock(mutex_);
  return copies_;
}
std::size_t FakeDevice::unregistered_copies() const {
  std::lock_guard lock(mutex_);
  return unregistered_copies_;
}
std::size_t FakeDevice::max_pending() const {
  std::lock_guard lock(mutex_);
  return max_pending_;
}
std::size_t FakeDevice::live_objects() const {
  std::lock_guard lock(mutex_);
  return streams_.size() + events_.size() + registered_.size();
}
std::size_t FakeDevice::misuse() const {
  std::lock_guard lock(mutex_);
  return misuse_;
}

bool FakeDevice::is_device_range(const void* p, std::size_t n, int device) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = device_ranges_.upper_bound(a);
  if (it == device_ranges_.begin()) return false;
  --it;
  return a + n <= it->first + it->second.first && it->second.second == device;
}

bool FakeDevice::is_registered(const void* p, std::size_t n) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = registered_.upper_bound(a);
  if (it == registered_.begin()) return false;
  --it;
  return a + n <= it->first + it->second;
}

std::optional<int> FakeDevice::device_of(const void* ptr) noexcept {
  std::lock_guard lock(mutex_);
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = device_ranges_.upper_bound(a);
  if (it == device_ranges_.begin()) return std::nullopt;
  --it;
  if (a >= it->first + std::max<std::size_t>(it->second.first, 1)) return std::nullopt;
  return it->second.second;
}

int FakeDevice::make_current(int device) noexcept {
  if (device < 0 || device >= device_count_) return kInvalidValue;
  t_current_device = device;
  return 0;
}

int FakeDevice::host_register(void* ptr, std::size_t length) noexcept {
  if (t_current_device < 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT, as the driver
  std::lock_guard lock(mutex_);
  if (!registered_.emplace(reinterpret_cast<std::uintptr_t>(ptr), length).second) return 712;
  return 0;
}

int FakeDevice::host_unregister(void* ptr) noexcept {
  if (t_current_device < 0) return 201;
  std::lock_guard lock(mutex_);
  return registered_.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 1 ? 0 : 713;
}

int FakeDevice::stream_create(void** stream) noexcept {
  if (t_current_device < 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT
  std::lock_guard lock(mutex_);
  auto s = std::make_unique<StreamState>();
  s->device = t_current_device;
  *stream = s.get();
  streams_.emplace(s.get(), std::move(s));
  return 0;
}

int FakeDevice::stream_destroy(void* stream) noexcept {
  std::lock_guard lock(mutex_);
  for (const Task& t : tasks_) {
    if (t.stream == stream) ++misuse_;  // destroyed with work still queued
  }
  return streams_.erase(static_cast<StreamState*>(stream)) == 1 ? 0 : 400;
}

int FakeDevice::event_create(void** event) noexcept {
  if (t_current_device < 0) return 201;
  std::lock_guard lock(mutex_);
  auto e = std::make_unique<EventState>();
  e->device = t_current_device;
  *event = e.get();
  events_.emplace(e.get(), std::move(e));
  return 0;
}

int FakeDevice::event_destroy(void* event) noexcept {
  std::lock_guard lock(mutex_);
  for (const Task& t : tasks_) {
    if (t.event == event) ++misuse_;
  }
  return events_.erase(static_cast<EventState*>(event)) == 1 ? 0 : 400;
}

int FakeDevice::event_record(void* event, void* stream) noexcept {
  std::lock_guard lock(mutex_);
  auto* e = static_cast<EventState*>(event);
  auto* s = static_cast<StreamState*>(stream);
  if (events_.count(e) == 0 || streams_.count(s) == 0) return 400;  // CUDA_ERROR_INVALID_HANDLE
  if (e->device != s->device || s->device != t_current_device) {
    ++misuse_;
    return 201;
  }
  if (record_fail_countdown_ > 0 && --record_fail_countdown_ == 0) return record_fail_code_;
  e->done = false;
  e->error = 0;
  tasks_.push_back(Task{s, e, nullptr, nullptr, 0, 0});
  work_cv_.notify_one();
  return 0;
}

int FakeDevice::event_query(void* event) noexcept {
  std::lock_guard lock(mutex_);
  auto* e = static_cast<EventState*>(event);
  if (events_.count(e) == 0) return 400;
  if (!e->done) return nvio::cuda::kNotReady;
  if (sync_fail_countdown_ > 0 && --sync_fail_countdown_ == 0) return sync_fail_code_;
  return e->error;
}

int FakeDevice::event_synchronize(void* event) noexcept {
  std::unique_lock lock(mutex_);
  auto* e = static_cast<EventState*>(event);
  if (events_.count(e) == 0) return 400;
  done_cv_.wait(lock, [&] { return e->done; });
  if (sync_fail_countdown_ > 0 && --sync_fail_countdown_ == 0) return sync_fail_code_;
  return e->error;
}

int FakeDevice::stream_synchronize(void* stream) noexcept {
  std::unique_lock lock(mutex_);
  auto* s = static_cast<StreamState*>(stream);
  if (streams_.count(s) == 0) return 400;
  ++stream_syncs_;
  if (stream_sync_code_ != 0) return stream_sync_code_;
  done_cv_.wait(lock, [&] {
    for (const Task& t : tasks_) {
      if (t.stream == s) return false;
    }
    return true;
  });
  const int error = s->pending_error;
  s->pending_error = 0;
  return error;
}

int FakeDevice::copy_async(void* dst, const void* src, std::size_t length, void* stream,
                           bool to_device) {
  std::lock_guard lock(mutex_);
  auto* s = static_cast<StreamState*>(stream);
  if (streams_.count(s) == 0) return 400;
  const void* device_side = to_device ? dst : src;
  const void* host_side = to_device ? src : dst;
  if (!is_device_range(device_side, length, s->device) || s->device != t_current_device) {
    ++misuse_;
    return kInvalidValue;
  }
  ++copies_;
  if (!is_registered(host_side, length)) ++unregistered_copies_;
  int error = 0;
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) {
    if (fail_at_call_) return fail_code_;
    error = fail_code_;
  }
  tasks_.push_back(Task{s, nullptr, dst, src, length, error});
  max_pending_ = std::max(max_pending_, tasks_.size());
  work_cv_.notify_one();
  return 0;
}

int FakeDevice::copy_to_device_async(void* dst, const void* src, std::size_t length,
                                     void* stream) noexcept {
  return copy_async(dst, src, length, stream, true);
}

int FakeDevice::copy_to_host_async(void* dst, const void* src, std::size_t length,
                                   void* stream) noexcept {
  return copy_async(dst, src, length, stream, false);
}

std::string FakeDevice::error_name(int code) {
  switch (code) {
    case kInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
    case kIllegalAddress: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case kLaunchFailure: return "CUDA_ERROR_LAUNCH_FAILED";
    default: return "CUDA_ERROR_" + std::to_string(code);
  }
}

std::string FakeDevice::error_string(int code) {
  return "fake device error " + std::to_string(code);
}

void FakeDevice::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping with nothing left
    Task t = tasks_.front();
    // Work "in the copy engine": outside the lock, after a small random delay.
    const auto delay = std::chrono::microseconds(rng_() % 200);
    lock.unlock();
    std::this_thread::sleep_for(delay);
    if (t.event == nullptr && t.error == 0) std::memcpy(t.dst, t.src, t.length);
    lock.lock();
    tasks_.pop_front();
    if (t.event != nullptr) {
      t.event->error = t.stream->pending_error;
      t.stream->pending_error = 0;
      t.event->done = true;
    } else if (t.error != 0) {
      t.stream->pending_error = t.error;
    }
    done_cv_.notify_all();  // event and stream synchronisations wait for this
  }
}

ScopedFakeDevice::ScopedFakeDevice(int device_count, unsigned seed)
    : fake_(std::make_shared<FakeDevice>(device_count, seed)),
      previous_(nvio::cuda::set_device_ops_for_testing(fake_)) {}

ScopedFakeDevice::~ScopedFakeDevice() { nvio::cuda::set_device_ops_for_testing(previous_); }

}  // namespace nvio_test
