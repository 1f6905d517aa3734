#include "cuda/driver.hpp"

#include <fmt/format.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/device_ops.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"

namespace nvio::cuda {

std::string Driver::error_name(int code) const {
  const char* s = nullptr;
  if (get_error_name != nullptr && get_error_name(code, &s) == abi::CUDA_SUCCESS && s != nullptr) {
    return s;
  }
  return fmt::format("CUDA error {}", code);
}

std::string Driver::error_string(int code) const {
  const char* s = nullptr;
  if (get_error_string != nullptr && get_error_string(code, &s) == abi::CUDA_SUCCESS &&
      s != nullptr) {
    return s;
  }
  return "unknown CUDA error";
}

Driver load_driver(Library lib) {
  Driver d;
  d.lib = std::move(lib);
  if (!d.lib) {
    d.reason = d.lib.error();
    return d;
  }
  std::string missing;
  const Library& l = d.lib;
  resolve(l, "cuGetErrorName", d.get_error_name, missing);
  resolve(l, "cuGetErrorString", d.get_error_string, missing);
  resolve(l, "cuInit", d.init, missing);
  resolve(l, "cuDriverGetVersion", d.driver_get_version, missing);
  resolve(l, "cuDeviceGetCount", d.device_get_count, missing);
  resolve(l, "cuDeviceGet", d.device_get, missing);
  resolve(l, "cuDeviceGetName", d.device_get_name, missing);
  resolve(l, "cuDeviceTotalMem_v2", d.device_total_mem, missing);
  resolve(l, "cuDeviceGetPCIBusId", d.device_get_pci_bus_id, missing);
  resolve(l, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, missing);
  resolve(l, "cuCtxSetCurrent", d.ctx_set_current, missing);
  resolve(l, "cuCtxGetCurrent", d.ctx_get_current, missing);
  resolve(l, "cuPointerGetAttribute", d.pointer_get_attribute, missing);
  resolve(l, "cuMemHostRegister_v2", d.mem_host_register, missing);
  resolve(l, "cuMemHostUnregister", d.mem_host_unregister, missing);
  resolve(l, "cuMemAlloc_v2", d.mem_alloc, missing);
  resolve(l, "cuMemFree_v2", d.mem_free, missing);
  resolve(l, "cuMemcpyHtoD_v2", d.memcpy_htod, missing);
  resolve(l, "cuMemcpyDtoH_v2", d.memcpy_dtoh, missing);
  resolve(l, "cuMemcpyHtoDAsync_v2", d.memcpy_htod_async, missing);
  resolve(l, "cuMemcpyDtoHAsync_v2", d.memcpy_dtoh_async, missing);
  resolve(l, "cuStreamCreate", d.stream_create, missing);
  resolve(l, "cuStreamDestroy_v2", d.stream_destroy, missing);
  resolve(l, "cuEventCreate", d.event_create, missing);
  resolve(l, "cuEventRecord", d.event_record, missing);
  resolve(l, "cuEventQuery", d.event_query, missing);
  resolve(l, "cuEventSynchronize", d.event_synchronize, missing);
  resolve(l, "cuStreamSynchronize", d.stream_synchronize, missing);
  resolve(l, "cuEventDestroy_v2", d.event_destroy, missing);
  if (!missing.empty()) {
    d.reason = fmt::format("{} lacks {} (driver too old?)", d.lib.path(), missing);
    return d;
  }
  d.init_result = d.init(0);
  if (d.init_result != abi::CUDA_SUCCESS) {
    d.reason =
        fmt::format("cuInit: {}: {}", d.error_name(d.init_result), d.error_string(d.init_result));
    return d;
  }
  d.ok = true;
  d.reason = "loaded";
  return d;
}

const Driver& driver() {
  // Leaked on purpose: CUDA must stay loaded until the process is gone (see library.hpp).
  static const Driver* d = new Driver(load_driver(Library::load(kDriverEnv, {kDriverSoname})));
  return *d;
}

namespace {

// How many shared objects the dynamic loader has loaded so far (it only grows).
unsigned long long loader_adds() noexcept {
  unsigned long long adds = 0;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t size, void* out) -> int {
        // dlpi_adds exists since glibc 2.4; older layouts are shorter than the field's end.
        const bool has_adds = size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds);
        *static_cast<unsigned long long*>(out) = has_adds ? info->dlpi_adds : 0;
        return 1;  // the first object is enough: the counter is the same in every callback
      },
      &adds);
  return adds;
}

}  // namespace

bool driver_already_loaded() {
  // Asked for every transfer whose memory kind is Auto. dlopen(RTLD_NOLOAD) of a name that is not
  // loaded searches the library path (an open of ld.so.cache and a stat per directory), tens of
  // microseconds: so the answer is kept, and asked again only after the loader has loaded
  // something new. Once the driver is loaded it stays (nvio never unloads it, see library.hpp).
  static std::atomic<bool> loaded{false};
  static std::atomic<unsigned long long> checked_at{0};  // loader_adds() of the last "no"
  if (loaded.load(std::memory_order_acquire)) return true;
  const unsigned long long adds = loader_adds();
  if (adds != 0 && adds == checked_at.load(std::memory_order_acquire)) return false;
  const char* env = std::getenv(kDriverEnv);
  if (Library::is_loaded(env != nullptr ? env : kDriverSoname)) {
    loaded.store(true, std::memory_order_release);
    return true;
  }
  checked_at.store(adds, std::memory_order_release);
  return false;
}

int make_context_current(const Driver& d, int device) noexcept {
  static std::mutex mutex;
  static std::map<int, abi::CUcontext>* contexts = new std::map<int, abi::CUcontext>;
  abi::CUcontext ctx = nullptr;
  {
    std::lock_guard lock(mutex);
    auto it = contexts->find(device);
    if (it == contexts->end()) {
      abi::CUdevice dev = 0;
      int rc = d.device_get(&dev, device);
      if (rc != abi::CUDA_SUCCESS) return rc;
      rc = d.primary_ctx_retain(&ctx, dev);
      if (rc != abi::CUDA_SUCCESS) return rc;
      contexts->emplace(device, ctx);
    } else {
      ctx = it->second;
    }
  }
  return d.ctx_set_current(ctx);
}

int make_a_context_current(const Driver& d) noexcept {
  abi::CUcontext ctx = nullptr;
  const int rc = d.ctx_get_current(&ctx);
  if (rc == abi::CUDA_SUCCESS && ctx != nullptr) return rc;
  return make_context_current(d, 0);
}

namespace {

abi::CUdeviceptr dptr(const void* p) { return reinterpret_cast<abi::CUdeviceptr>(p); }

// The real device operations: thin forwarding to the driver.
class DriverOps final : public DeviceOps {
 public:
  explicit DriverOps(const Driver& d) : d_(d) {}

  std::optional<int> device_of(const void* ptr) noexcept override {
    unsigned type = 0;
    if (d_.pointer_get_attribute(&type, abi::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr(ptr)) !=
        abi::CUDA_SUCCESS) {
      return std::nullopt;  // not known to CUDA: ordinary host memory
    }
    if (type != abi::CU_MEMORYTYPE_DEVICE && type != abi::CU_MEMORYTYPE_UNIFIED) {
      return std::nullopt;
    }
    int ordinal = 0;
    if (d_.pointer_get_attribute(&ordinal, abi::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr(ptr)) !=
        abi::CUDA_SUCCESS) {
      return std::nullopt;
    }
    return ordinal;
  }
  int make_current(int device) noexcept override { return make_context_current(d_, device); }
  int host_register(void* ptr, std::size_t length) noexcept override {
    // PORTABLE: usable from every context, so one registration serves all devices.
    return d_.mem_host_register(ptr, length, abi::kMemHostRegisterPortable);
  }
  int host_unregister(void* ptr) noexcept override { return d_.mem_host_unregister(ptr); }
  int stream_create(void** stream) noexcept override {
    abi::CUstream s = nullptr;
    const int rc = d_.stream_create(&s, abi::CU_STREAM_NON_BLOCKING);
    *stream = s;
    return rc;
  }
  int stream_destroy(void* stream) noexcept override {
    return d_.stream_destroy(static_cast<abi::CUstream>(stream));
  }
  int event_create(void** event) noexcept override {
    abi::CUevent e = nullptr;
    const int rc = d_.event_create(&e, abi::CU_EVENT_DISABLE_TIMING);
    *event = e;
    return rc;
  }
  int event_destroy(void* event) noexcept override {
    return d_.event_destroy(static_cast<abi::CUevent>(event));
  }
  int event_record(void* event, void* stream) noexcept override {
    return d_.event_record(static_cast<abi::CUevent>(event), static_cast<abi::CUstream>(stream));
  }
  int event_query(void* event) noexcept override {
    return d_.event_query(static_cast<abi::CUevent>(event));
  }
  int event_synchronize(void* event) noexcept override {
    return d_.event_synchronize(static_cast<abi::CUevent>(event));
  }
  int stream_synchronize(void* stream) noexcept override {
    return d_.stream_synchronize(static_cast<abi::CUstream>(stream));
  }
  int copy_to_device_async(void* dst, const void* src, std::size_t length,
                           void* stream) noexcept override {
    return d_.memcpy_htod_async(dptr(dst), src, length, static_cast<abi::CUstream>(stream));
  }
  int copy_to_host_async(void* dst, const void* src, std::size_t length,
                         void* stream) noexcept override {
    return d_.memcpy_dtoh_async(dst, dptr(src), length, static_cast<abi::CUstream>(stream));
  }
  std::string error_name(int code) override { return d_.error_name(code); }
  std::string error_string(int code) override { return d_.error_string(code); }

 private:
  const Driver& d_;
};

std::mutex g_override_mutex;
std::shared_ptr<DeviceOps> g_override;

}  // namespace

std::shared_ptr<DeviceOps> device_ops_override() {
  std::lock_guard lock(g_override_mutex);
  return g_override;
}

std::shared_ptr<DeviceOps> set_device_ops_for_testing(std::shared_ptr<DeviceOps> ops) {
  std::lock_guard lock(g_override_mutex);
  std::swap(g_override, ops);
  return ops;
}

std::shared_ptr<DeviceOps> device_ops() {
  if (auto o = device_ops_override()) return o;
  const Driver& d = driver();
  if (!d.ok) {
    throw GpuError("CUDA driver", d.init_result,
                   d.init_result != 0 ? d.error_name(d.init_result) : "",
                   "device memory was given but the CUDA driver cannot be used: " + d.reason);
  }
  // Shares the process-lifetime driver; the deleter does nothing to it.
  static const std::shared_ptr<DeviceOps> ops = std::make_shared<DriverOps>(d);
  return ops;
}

void throw_gpu_error(DeviceOps& ops, const char* api, int code, const std::string& path,
                     std::uint64_t offset, std::uint64_t length) {
  throw GpuError(api, code, ops.error_name(code), ops.error_string(code), path, offset, length);
}

Registration::Registration(DeviceOps& ops, void* ptr, std::size_t length, int& code) noexcept
    : ops_(&ops) {
  code = ops.host_register(ptr, length);
  if (code == kSuccess) ptr_ = ptr;
}

void Registration::reset() noexcept {
  if (ptr_ != nullptr) ops_->host_unregister(ptr_);
  ptr_ = nullptr;
}

}  // namespace nvio::cuda

namespace nvio {

const char* to_string(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::Auto: return "auto";
    case MemoryKind::Host: return "host";
    case MemoryKind::Device: return "device";
  }
  return "?";
}

MemoryKind memory_kind(const void* ptr) noexcept {
  if (ptr == nullptr) return MemoryKind::Host;
  std::shared_ptr<cuda::DeviceOps> ops = cuda::device_ops_override();
  if (!ops) {
    // Never load or initialise CUDA for a process that has not: host memory is all it can have.
    if (!cuda::driver_already_loaded()) return MemoryKind::Host;
    const cuda::Driver& d = cuda::driver();
    if (!d.ok) return MemoryKind::Host;
    try {
      ops = cuda::device_ops();
    } catch (...) {
      return MemoryKind::Host;
    }
  }
  return ops->device_of(ptr) ? MemoryKind::Device : MemoryKind::Host;
}

namespace {

const cuda::Driver& usable_driver(const char* what) {
  const cuda::Driver& d = cuda::driver();
  if (!d.ok) {
    throw GpuError(what, d.init_result, d.init_result != 0 ? d.error_name(d.init_result) : "",
                   "the CUDA driver cannot be used: " + d.reason);
  }
  return d;
}

void check(const cuda::Driver& d, const char* api, int rc) {
  if (rc != cuda::abi::CUDA_SUCCESS) {
    throw GpuError(api, rc, d.error_name(rc), d.error_string(rc));
  }
}

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t size, int device) : size_(size), device_(device) {
  if (size == 0) throw InvalidArgument("DeviceBuffer: size must be at least 1 byte");
  const cuda::Driver& d = usable_driver("cuMemAlloc");
  check(d, "cuCtxSetCurrent", cuda::make_context_current(d, device));
  cuda::abi::CUdeviceptr p = 0;
  const int rc = d.mem_alloc(&p, size);
  if (rc != cuda::abi::CUDA_SUCCESS) {
    throw GpuError("cuMemAlloc", rc, d.error_name(rc),
                   fmt::format("{}: {} bytes on device {}", d.error_string(rc), size, device));
  }
  ptr_ = static_cast<std::uintptr_t>(p);
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), size_(other.size_), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, 0);
    size_ = other.size_;
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ == 0) return;
  const cuda::Driver& d = cuda::driver();
  // The context may not be current on this thread (a buffer can be freed anywhere).
  if (cuda::make_context_current(d, device_) == cuda::abi::CUDA_SUCCESS) {
    d.mem_free(static_cast<cuda::abi::CUdeviceptr>(ptr_));
  }
  ptr_ = 0;
}

void DeviceBuffer::copy_from_host(const void* src, std::size_t length, std::size_t offset) {
  if (offset > size_ || length > size_ - offset) {
    throw InvalidArgument(fmt::format("DeviceBuffer: copy of {} bytes at {} exceeds its {} bytes",
                                      length, offset, size_));
  }
  const cuda::Driver& d = usable_driver("cuMemcpyHtoD");
  check(d, "cuCtxSetCurrent", cuda::make_context_current(d, device_));
  check(d, "cuMemcpyHtoD", d.memcpy_htod(ptr_ + offset, src, length));
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t length, std::size_t offset) const {
  if (offset > size_ || length > size_ - offset) {
    throw InvalidArgument(fmt::format("DeviceBuffer: copy of {} bytes at {} exceeds its {} bytes",
                                      length, offset, size_));
  }
  const cuda::Driver& d = usable_driver("cuMemcpyDtoH");
  check(d, "cuCtxSetCurrent", cuda::make_context_current(d, device_));
  check(d, "cuMemcpyDtoH", d.memcpy_dtoh(dst, ptr_ + offset, length));
}

HostRegistration::HostRegistration(void* ptr, std::size_t length) {
  const cuda::Driver& d = usable_driver("cuMemHostRegister");
  check(d, "cuCtxSetCurrent", cuda::make_a_context_current(d));
  check(d, "cuMemHostRegister",
        d.mem_host_register(ptr, length, cuda::abi::kMemHostRegisterPortable));
  ptr_ = ptr;
}

HostRegistration::~HostRegistration() { release(); }

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

void HostRegistration::release() noexcept {
  if (ptr_ == nullptr) return;
  // Released on any thread, which may have no context current.
  const cuda::Driver& d = cuda::driver();
  if (cuda::make_a_context_current(d) == cuda::abi::CUDA_SUCCESS) d.mem_host_unregister(ptr_);
  ptr_ = nullptr;
}

}  // namespace nvio
