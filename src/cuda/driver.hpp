// The CUDA driver API, loaded with dlopen on first use (see gpu.hpp for the environment override).
//
// Thread-safety: driver() loads once (std::call_once) and is immutable afterwards. Retained
// primary contexts are kept for the life of the process (released never: a context released
// while another library or a late worker still uses it would be destroyed under it).
#pragma once

#include <functional>
#include <string>

#include "cuda/cuda_abi.hpp"
#include "cuda/library.hpp"

namespace nvio::cuda {

inline constexpr const char* kDriverEnv = "NVIO_CUDA_DRIVER_LIBRARY";
inline constexpr const char* kDriverSoname = "libcuda.so.1";

struct Driver {
  Library lib;
  bool ok = false;      // loaded, every symbol found, cuInit succeeded
  std::string reason;   // why not ok (or "loaded")
  int init_result = 0;  // cuInit's CUresult
  abi::PFN_cuGetErrorName get_error_name = nullptr;
  abi::PFN_cuGetErrorString get_error_string = nullptr;
  abi::PFN_cuInit init = nullptr;
  abi::PFN_cuDriverGetVersion driver_get_version = nullptr;
  abi::PFN_cuDeviceGetCount device_get_count = nullptr;
  abi::PFN_cuDeviceGet device_get = nullptr;
  abi::PFN_cuDeviceGetName device_get_name = nullptr;
  abi::PFN_cuDeviceTotalMem_v2 device_total_mem = nullptr;
  abi::PFN_cuDeviceGetPCIBusId device_get_pci_bus_id = nullptr;
  abi::PFN_cuDevicePrimaryCtxRetain primary_ctx_retain = nullptr;
  abi::PFN_cuCtxSetCurrent ctx_set_current = nullptr;
  abi::PFN_cuCtxGetCurrent ctx_get_current = nullptr;
  abi::PFN_cuPointerGetAttribute pointer_get_attribute = nullptr;
  abi::PFN_cuMemHostRegister_v2 mem_host_register = nullptr;
  abi::PFN_cuMemHostUnregister mem_host_unregister = nullptr;
  abi::PFN_cuMemAlloc_v2 mem_alloc = nullptr;
  abi::PFN_cuMemFree_v2 mem_free = nullptr;
  abi::PFN_cuMemcpyHtoD_v2 memcpy_htod = nullptr;
  abi::PFN_cuMemcpyDtoH_v2 memcpy_dtoh = nullptr;
  abi::PFN_cuMemcpyHtoDAsync_v2 memcpy_htod_async = nullptr;
  abi::PFN_cuMemcpyDtoHAsync_v2 memcpy_dtoh_async = nullptr;
  abi::PFN_cuStreamCreate stream_create = nullptr;
  abi::PFN_cuStreamDestroy_v2 stream_destroy = nullptr;
  abi::PFN_cuEventCreate event_create = nullptr;
  abi::PFN_cuEventRecord event_record = nullptr;
  abi::PFN_cuEventQuery event_query = nullptr;
  abi::PFN_cuEventSynchronize event_synchronize = nullptr;
  abi::PFN_cuStreamSynchronize stream_synchronize = nullptr;
  abi::PFN_cuEventDestroy_v2 event_destroy = nullptr;

  std::string error_name(int code) const;
  std::string error_string(int code) const;
};

// Loads `lib` as the CUDA driver: resolves the symbols and runs cuInit(0) (which creates no
// context). Never throws; `reason` says what failed.
Driver load_driver(Library lib);
// The process's driver, loaded on first call.
const Driver& driver();
// Whether the driver library is already loaded in this process (by nvio or by anyone else, e.g.
// PyTorch), without loading it.
bool driver_already_loaded();
// Makes `device`'s primary context current on the calling thread, retaining it on first use.
int make_context_current(const Driver& d, int device) noexcept;
// Leaves a context current on the calling thread: the one already there, else device 0's primary
// context (device 0 exists wherever a device does). For calls that need some context but no
// particular one, such as a portable cuMemHostRegister: without one they fail with
// CUDA_ERROR_INVALID_CONTEXT.
int make_a_context_current(const Driver& d) noexcept;

}  // namespace nvio::cuda
