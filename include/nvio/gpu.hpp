// GPU memory: what this machine offers, and the few device-memory tools the CLI and bindings need.
//
// nvio has no build or run dependency on CUDA. The CUDA driver (libcuda.so.1) and cuFile
// (libcufile.so.0) are loaded with dlopen the first time device memory is used or gpu_info() is
// called; the same build runs with and without a GPU and with and without cuFile. Environment
// overrides for the libraries (a path; a missing file means "unavailable" with the loader's
// reason):
//   NVIO_CUDA_DRIVER_LIBRARY   default libcuda.so.1
//   NVIO_CUFILE_LIBRARY        default libcufile.so.0, then libcufile.so
//
// Device memory reaches the handle as a MemoryKind per operation (ReadOptions / WriteOptions).
// Host-only processes never load or initialise CUDA: MemoryKind::Auto asks the driver about a
// pointer only when libcuda is already loaded in the process.
//
// Thread-safety: every function here may be called from any thread. gpu_info() probes once per
// process and never throws (failures become reasons). Errors of the other calls are GpuError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// Where the bytes of a buffer live. Auto: ask CUDA (only if the process already loaded it).
enum class MemoryKind { Auto, Host, Device };
const char* to_string(MemoryKind kind) noexcept;

// How cuFile (GPUDirect Storage) would move device memory here.
enum class GdsMode {
  Unavailable,    // no cuFile, no GPU, or cuFileDriverOpen failed: device memory bounces
  Compatibility,  // cuFile works but without peer-to-peer DMA (cuFile's own host bounce)
  P2P,            // real GPUDirect: nvidia-fs or PCI P2PDMA between the NVMe and the GPU
};
const char* to_string(GdsMode mode) noexcept;

struct GpuDevice {
  int ordinal = 0;
  std::string name;
  std::uint64_t total_memory = 0;  // bytes
  std::string pci_bus_id;          // e.g. "0000:3b:00.0"
};

struct GpuInfo {
  bool driver_loaded = false;
  std::string driver_path;    // what was dlopen'ed (or tried)
  std::string driver_reason;  // why it is unusable, or "loaded"
  int driver_version = 0;     // CUDA version the driver supports, e.g. 13000; 0 when unknown
  std::optional<int> runtime_version;  // libcudart's, when one could be loaded (report only)
  std::string runtime_path;
  std::vector<GpuDevice> devices;
  bool cufile_loaded = false;
  std::string cufile_path;
  std::string cufile_reason;
  GdsMode gds_mode = GdsMode::Unavailable;
  std::string gds_reason;
  bool usable() const noexcept { return driver_loaded && !devices.empty(); }
};

// Probes the driver, its devices, cuFile and the GDS mode, once per process. Opening the cuFile
// driver (to learn the mode) initialises CUDA, so this is called only by the report, the bindings
// and the first operation on device memory; never by host-only I/O.
const GpuInfo& gpu_info();

// The kind of memory at `ptr` as CUDA sees it: Device for device (and managed) memory, Host
// otherwise, including when CUDA is not loaded in this process.
MemoryKind memory_kind(const void* ptr) noexcept;

// Registers [ptr, ptr + length) of device memory with cuFile (cuFileBufRegister) so that GDS
// transfers into it, or into any view of it, skip cuFile's internal bounce buffers. Returns false
// (and registers nothing) when cuFile is not usable here; throws GpuError when cuFile refuses.
bool gds_register_buffer(void* ptr, std::size_t length);
// Undoes gds_register_buffer for the same base pointer. Returns false when it was not registered.
bool gds_deregister_buffer(void* ptr);

// Device memory allocated with cuMemAlloc on one device (its primary context), for the CLI
// benchmark and tests. Move-only; thread-safety: none, share the pointer, not the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws GpuError when there is no usable GPU `device` or the allocation fails.
  DeviceBuffer(std::size_t size, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return reinterpret_cast<void*>(ptr_); }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  // Synchronous copies between this buffer (at `offset`) and host memory. Throw GpuError.
  void copy_from_host(const void* src, std::size_t length, std::size_t offset = 0);
  void copy_to_host(void* dst, std::size_t length, std::size_t offset = 0) const;

 private:
  void release() noexcept;
  std::uintptr_t ptr_ = 0;
  std::size_t size_ = 0;
  int device_ = 0;
};

// Page-locks host memory for DMA with cuMemHostRegister (portable: for every device) for its
// lifetime (move-only). The driver needs a context current: where the calling thread has none,
// device 0's primary context is made current on it (as the CUDA runtime's first call would).
// Throws GpuError when CUDA is unusable or refuses.
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* ptr, std::size_t length);
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
};

}  // namespace nvio
NVIO_API_END
