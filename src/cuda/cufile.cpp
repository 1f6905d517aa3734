#include "cuda/cufile.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/driver.hpp"
#include "nvio/errors.hpp"

namespace nvio::cuda {
namespace {

struct CuFileErrorInfo {
  const char* name;
  const char* text;
};

// CUfileOpError values (CUFILEOP_BASE_ERR + n) with a short description of each.
const std::map<int, CuFileErrorInfo>& cufile_errors() {
  static const std::map<int, CuFileErrorInfo> table = {
      {0, {"CU_FILE_SUCCESS", "success"}},
      {5001,
       {"CU_FILE_DRIVER_NOT_INITIALIZED",
        "nvidia-fs is not loaded and compatibility mode is off (allow_compat_mode in "
        "cufile.json)"}},
      {5002, {"CU_FILE_DRIVER_INVALID_PROPS", "invalid driver property"}},
      {5003, {"CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "driver property out of range"}},
      {5004, {"CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs version does not match"}},
      {5005, {"CU_FILE_DRIVER_VERSION_READ_ERROR", "could not read the nvidia-fs version"}},
      {5006, {"CU_FILE_DRIVER_CLOSING", "the cuFile driver is shutting down"}},
      {5007, {"CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage unsupported on this platform"}},
      {5008, {"CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage unsupported for this file"}},
      {5009, {"CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage unsupported on this GPU"}},
      {5010, {"CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs ioctl failed"}},
      {5011, {"CU_FILE_CUDA_DRIVER_ERROR", "CUDA driver error"}},
      {5012, {"CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer"}},
      {5013, {"CU_FILE_CUDA_MEMORY_TYPE_INVALID", "pointer is not of a supported memory type"}},
      {5014, {"CU_FILE_CUDA_POINTER_RANGE_ERROR", "range exceeds the device allocation"}},
      {5015, {"CU_FILE_CUDA_CONTEXT_MISMATCH", "CUDA context mismatch"}},
      {5016, {"CU_FILE_INVALID_MAPPING_SIZE", "access beyond the maximum pinned size"}},
      {5017, {"CU_FILE_INVALID_MAPPING_RANGE", "access beyond the mapped size"}},
      {5018, {"CU_FILE_INVALID_FILE_TYPE", "unsupported file type"}},
      {5019, {"CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags"}},
      {5020, {"CU_FILE_DIO_NOT_SET", "the descriptor is not O_DIRECT"}},
      {5022, {"CU_FILE_INVALID_VALUE", "invalid argument"}},
      {5023, {"CU_FILE_MEMORY_ALREADY_REGISTERED", "buffer already registered"}},
      {5024, {"CU_FILE_MEMORY_NOT_REGISTERED", "buffer not registered"}},
      {5025, {"CU_FILE_PERMISSION_DENIED", "driver or file access denied"}},
      {5026, {"CU_FILE_DRIVER_ALREADY_OPEN", "driver already open"}},
      {5027, {"CU_FILE_HANDLE_NOT_REGISTERED", "file handle not registered"}},
      {5028, {"CU_FILE_HANDLE_ALREADY_REGISTERED", "file handle already registered"}},
      {5029, {"CU_FILE_DEVICE_NOT_FOUND", "GPU not found"}},
      {5030, {"CU_FILE_INTERNAL_ERROR", "cuFile internal error"}},
      {5031, {"CU_FILE_GETNEWFD_FAILED", "could not obtain a new file descriptor"}},
      {5033, {"CU_FILE_NVFS_SETUP_ERROR", "nvidia-fs initialisation failed"}},
      {5034, {"CU_FILE_IO_DISABLED", "GPUDirect Storage disabled by configuration for this file"}},
      {5035, {"CU_FILE_BATCH_SUBMIT_FAILED", "batch submission failed"}},
      {5036, {"CU_FILE_GPU_MEMORY_PINNING_FAILED", "could not pin GPU memory"}},
      {5037, {"CU_FILE_BATCH_FULL", "batch queue full"}},
      {5038, {"CU_FILE_ASYNC_NOT_SUPPORTED", "stream operations unsupported"}},
      {5043, {"CU_FILE_NOMEM_ERROR", "cuFile out of memory"}},
      {5044, {"CU_FILE_IO_ERROR", "cuFile I/O error"}},
      {5045, {"CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "internal buffer registration failed"}},
      {5047, {"CU_FILE_INVALID_CONTEXT_ERROR", "invalid CUDA context"}},
      {5048, {"CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", "nvidia-fs internal error"}},
      {5049, {"CU_FILE_BATCH_NOCOMPAT_ERROR", "compatibility mode is off"}},
  };
  return table;
}

// Registered device buffers: base address -> length. cuFile wants the registered base and an
// offset into it for I/O on a view of a registered buffer.
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> buffers;
};

Registry& registry() {
  static auto* r = new Registry;  // leaked: may be consulted from static destructors
  return *r;
}

}  // namespace

std::string cufile_error_name(int err) {
  const auto& t = cufile_errors();
  auto it = t.find(err < 0 ? -err : err);
  return it != t.end() ? it->second.name : fmt::format("CUfileOpError {}", err);
}

std::string cufile_error_text(int err) {
  const auto& t = cufile_errors();
  auto it = t.find(err < 0 ? -err : err);
  return it != t.end() ? it->second.text : "unknown cuFile error";
}

std::string describe(const abi::CUfileError_t& status) {
  std::string s = cufile_error_text(status.err);
  if (status.err == abi::CU_FILE_CUDA_DRIVER_ERROR || status.cu_err != abi::CUDA_SUCCESS) {
    const Driver& d = driver();
    s += fmt::format("; CUDA {} ({}): {}", d.error_name(status.cu_err), status.cu_err,
                     d.error_string(status.cu_err));
  }
  return s;
}

CuFile load_cufile(Library lib) {
  CuFile c;
  c.lib = std::move(lib);
  if (!c.lib) {
    c.reason = c.lib.error();
    return c;
  }
  std::string missing;
  resolve(c.lib, "cuFileDriverOpen", c.driver_open, missing);
  resolve(c.lib, "cuFileDriverGetProperties", c.driver_get_properties, missing);
  resolve(c.lib, "cuFileHandleRegister", c.handle_register, missing);
  resolve(c.lib, "cuFileHandleDeregister", c.handle_deregister, missing);
  resolve(c.lib, "cuFileBufRegister", c.buf_register, missing);
  resolve(c.lib, "cuFileBufDeregister", c.buf_deregister, missing);
  resolve(c.lib, "cuFileRead", c.read, missing);
  resolve(c.lib, "cuFileWrite", c.write, missing);
  if (!missing.empty()) {
    c.reason = fmt::format("{} lacks {}", c.lib.path(), missing);
    return c;
  }
  c.loaded = true;
  c.reason = "loaded";
  return c;
}

const CuFile& cufile() {
  static const CuFile* c =
      new CuFile(load_cufile(Library::load(kCuFileEnv, {"libcufile.so.0", "libcufile.so"})));
  return *c;
}

GdsMode classify_gds(bool driver_opened, bool nvidia_fs_present, bool p2pdma_flag,
                     std::string& reason) {
  if (!driver_opened) return GdsMode::Unavailable;  // reason already says why
  if (nvidia_fs_present) {
    reason = "cuFile driver open; nvidia-fs is loaded: peer-to-peer DMA between NVMe and GPU";
    return GdsMode::P2P;
  }
  if (p2pdma_flag) {
    reason = "cuFile driver open; PCI P2PDMA supported: peer-to-peer DMA between NVMe and GPU";
    return GdsMode::P2P;
  }
  reason =
      "cuFile driver open in compatibility mode (no nvidia-fs, no PCI P2PDMA): cuFile moves data "
      "through its own host buffers";
  return GdsMode::Compatibility;
}

TransportChoice choose_transport(GpuDirect option, GdsMode mode, const std::string& gds_reason) {
  switch (option) {
    case GpuDirect::Off: return {Transport::Bounce, false, "gpu_direct=off"};
    case GpuDirect::Auto:
      if (mode == GdsMode::P2P) return {Transport::Gds, false, "gpu_direct=auto: " + gds_reason};
      return {Transport::Bounce, false,
              std::string("gpu_direct=auto: GDS is ") + to_string(mode) + " (" + gds_reason + ")"};
    case GpuDirect::On:
      if (mode != GdsMode::Unavailable) return {Transport::Gds, false, "gpu_direct=on"};
      return {Transport::Bounce, true,
              "gpu_direct=on but cuFile cannot be used (" + gds_reason +
                  "); device memory moves through the host bounce path"};
  }
  return {Transport::Bounce, false, "?"};
}

CuFileHandle::CuFileHandle(int fd, const std::string& path) {
  // Without a loaded library and an open driver there is nothing to call (a null function).
  const GpuInfo& info = gpu_info();
  if (info.gds_mode == GdsMode::Unavailable) {
    throw GpuError("cuFileHandleRegister", 0, "", "cuFile cannot be used: " + info.gds_reason,
                   path);
  }
  const CuFile& c = cufile();
  abi::CUfileDescr_t descr{};
  descr.type = abi::CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  descr.handle.fd = fd;
  descr.fs_ops = nullptr;
  const abi::CUfileError_t st = c.handle_register(&handle_, &descr);
  if (st.err != abi::CU_FILE_SUCCESS) {
    handle_ = nullptr;
    throw GpuError("cuFileHandleRegister", st.err, cufile_error_name(st.err), describe(st), path);
  }
}

CuFileHandle::~CuFileHandle() {
  if (handle_ != nullptr) cufile().handle_deregister(handle_);
}

CuFileHandle::CuFileHandle(CuFileHandle&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)) {}

CuFileHandle& CuFileHandle::operator=(CuFileHandle&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) cufile().handle_deregister(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

std::int64_t gds_transfer(const CuFileHandle& fh, bool is_read, void* buf, std::size_t length,
                          std::uint64_t file_offset) {
  const CuFile& c = cufile();
  auto addr = reinterpret_cast<std::uintptr_t>(buf);
  std::uintptr_t base = addr;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.buffers.upper_bound(addr);
    if (it != r.buffers.begin()) {
      --it;
      if (addr + length <= it->first + it->second) base = it->first;
    }
  }
  void* base_ptr = reinterpret_cast<void*>(base);
  const auto buf_offset = static_cast<off_t>(addr - base);
  errno = 0;
  const ssize_t n =
      is_read ? c.read(fh.get(), base_ptr, length, static_cast<off_t>(file_offset), buf_offset)
              : c.write(fh.get(), base_ptr, length, static_cast<off_t>(file_offset), buf_offset);
  if (n == -1) return -(errno != 0 ? errno : EIO);  // -1: the error is in errno
  return n;
}

}  // namespace nvio::cuda

namespace nvio {

bool gds_register_buffer(void* ptr, std::size_t length) {
  if (ptr == nullptr || length == 0) {
    throw InvalidArgument(
        fmt::format("gds_register_buffer: empty buffer ({} bytes at {})", length, ptr));
  }
  if (gpu_info().gds_mode == GdsMode::Unavailable) return false;
  const cuda::CuFile& c = cuda::cufile();
  const cuda::abi::CUfileError_t st = c.buf_register(ptr, length, 0);
  if (st.err != cuda::abi::CU_FILE_SUCCESS) {
    throw GpuError("cuFileBufRegister", st.err, cuda::cufile_error_name(st.err),
                   fmt::format("{} ({} bytes at {})", cuda::describe(st), length, ptr));
  }
  auto& r = cuda::registry();
  std::lock_guard lock(r.mutex);
  r.buffers[reinterpret_cast<std::uintptr_t>(ptr)] = length;
  return true;
}

bool gds_deregister_buffer(void* ptr) {
  auto& r = cuda::registry();
  {
    std::lock_guard lock(r.mutex);
    if (r.buffers.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 0) return false;
  }
  const cuda::abi::CUfileError_t st = cuda::cufile().buf_deregister(ptr);
  if (st.err != cuda::abi::CU_FILE_SUCCESS) {
    throw GpuError("cuFileBufDeregister", st.err, cuda::cufile_error_name(st.err),
                   cuda::describe(st));
  }
  return true;
}

}  // namespace nvio
