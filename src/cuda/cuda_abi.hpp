// The few CUDA driver API and cuFile declarations nvio uses, written out here so that nvio builds
// without a CUDA toolkit and loads libcuda / libcufile with dlopen only when device memory is used.
//
// Every type, constant and signature must match the real ABI exactly. They come from the public
// headers' documented API (cuda.h of CUDA 13, cufile.h of cuFile 1.x); where cuda.h maps a name to
// a versioned symbol (cuMemAlloc -> cuMemAlloc_v2), the versioned symbol is the one looked up.
// tests/cpp/cuda_abi_check.cpp compiles these against the real cuda.h when one is installed.
//
// Thread-safety: declarations only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace nvio::cuda::abi {

// ---- driver API (cuda.h) ----------------------------------------------------------------------
using CUresult = int;  // enum cudaError_enum: an int-sized enum
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // 64-bit platforms
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUpointer_attribute = int;  // enum CUpointer_attribute_enum
using CUdevice_attribute = int;   // enum CUdevice_attribute_enum

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;

inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr unsigned CU_MEMORYTYPE_HOST = 1;
inline constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
inline constexpr unsigned CU_MEMORYTYPE_ARRAY = 3;
inline constexpr unsigned CU_MEMORYTYPE_UNIFIED = 4;

inline constexpr unsigned kMemHostRegisterPortable = 0x01;  // CU_MEMHOSTREGISTER_PORTABLE (a macro)
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;

using PFN_cuGetErrorName = CUresult (*)(CUresult error, const char** pStr);
using PFN_cuGetErrorString = CUresult (*)(CUresult error, const char** pStr);
using PFN_cuInit = CUresult (*)(unsigned int Flags);
using PFN_cuDriverGetVersion = CUresult (*)(int* driverVersion);
using PFN_cuDeviceGetCount = CUresult (*)(int* count);
using PFN_cuDeviceGet = CUresult (*)(CUdevice* device, int ordinal);
using PFN_cuDeviceGetName = CUresult (*)(char* name, int len, CUdevice dev);
using PFN_cuDeviceTotalMem_v2 = CUresult (*)(std::size_t* bytes, CUdevice dev);
using PFN_cuDeviceGetPCIBusId = CUresult (*)(char* pciBusId, int len, CUdevice dev);
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext* pctx, CUdevice dev);
using PFN_cuDevicePrimaryCtxRelease_v2 = CUresult (*)(CUdevice dev);
using PFN_cuCtxSetCurrent = CUresult (*)(CUcontext ctx);
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext* pctx);
using PFN_cuPointerGetAttribute = CUresult (*)(void* data, CUpointer_attribute attribute,
                                               CUdeviceptr ptr);
using PFN_cuMemHostRegister_v2 = CUresult (*)(void* p, std::size_t bytesize, unsigned int Flags);
using PFN_cuMemHostUnregister = CUresult (*)(void* p);
using PFN_cuMemAlloc_v2 = CUresult (*)(CUdeviceptr* dptr, std::size_t bytesize);
using PFN_cuMemFree_v2 = CUresult (*)(CUdeviceptr dptr);
using PFN_cuMemcpyHtoD_v2 = CUresult (*)(CUdeviceptr dstDevice, const void* srcHost,
                                         std::size_t ByteCount);
using PFN_cuMemcpyDtoH_v2 = CUresult (*)(void* dstHost, CUdeviceptr srcDevice,
                                         std::size_t ByteCount);
using PFN_cuMemcpyHtoDAsync_v2 = CUresult (*)(CUdeviceptr dstDevice, const void* srcHost,
                                              std::size_t ByteCount, CUstream hStream);
using PFN_cuMemcpyDtoHAsync_v2 = CUresult (*)(void* dstHost, CUdeviceptr srcDevice,
                                              std::size_t ByteCount, CUstream hStream);
using PFN_cuStreamCreate = CUresult (*)(CUstream* phStream, unsigned int Flags);
using PFN_cuStreamDestroy_v2 = CUresult (*)(CUstream hStream);
using PFN_cuEventCreate = CUresult (*)(CUevent* phEvent, unsigned int Flags);
using PFN_cuEventRecord = CUresult (*)(CUevent hEvent, CUstream hStream);
using PFN_cuEventQuery = CUresult (*)(CUevent hEvent);
using PFN_cuEventSynchronize = CUresult (*)(CUevent hEvent);
using PFN_cuStreamSynchronize = CUresult (*)(CUstream hStream);
using PFN_cuEventDestroy_v2 = CUresult (*)(CUevent hEvent);

// ---- runtime API (cuda_runtime_api.h), for the report only ------------------------------------
using PFN_cudaRuntimeGetVersion = int (*)(int* runtimeVersion);

// ---- cuFile (cufile.h) ------------------------------------------------------------------------
using CUfileOpError = int;  // enum CUfileOpError
inline constexpr CUfileOpError CU_FILE_SUCCESS = 0;
inline constexpr int kCuFileOpBaseErr = 5000;  // CUFILEOP_BASE_ERR (a macro)
inline constexpr CUfileOpError CU_FILE_CUDA_DRIVER_ERROR = kCuFileOpBaseErr + 11;

struct CUfileError_t {
  CUfileOpError err;
  CUresult cu_err;
};

inline constexpr int CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1;  // enum CUfileFileHandleType

struct CUfileFSOps_t;
struct CUfileDescr_t {
  int type;  // enum CUfileFileHandleType
  union {
    int fd;
    void* handle;
  } handle;
  const CUfileFSOps_t* fs_ops;
};
using CUfileHandle_t = void*;

struct CUfileDrvProps_t {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};
// Bits of CUfileDrvProps_t: nvfs.dcontrolflags (CUfileDriverControlFlags) and fflags
// (CUfileFeatureFlags).
inline constexpr unsigned CU_FILE_ALLOW_COMPAT_MODE = 1;
inline constexpr unsigned CU_FILE_P2P_SUPPORTED = 4;  // PCI P2PDMA

using PFN_cuFileDriverOpen = CUfileError_t (*)();
using PFN_cuFileDriverGetProperties = CUfileError_t (*)(CUfileDrvProps_t* props);
using PFN_cuFileHandleRegister = CUfileError_t (*)(CUfileHandle_t* fh, CUfileDescr_t* descr);
using PFN_cuFileHandleDeregister = void (*)(CUfileHandle_t fh);
using PFN_cuFileBufRegister = CUfileError_t (*)(const void* bufPtr_base, std::size_t length,
                                                int flags);
using PFN_cuFileBufDeregister = CUfileError_t (*)(const void* bufPtr_base);
using PFN_cuFileRead = ssize_t (*)(CUfileHandle_t fh, void* bufPtr_base, std::size_t size,
                                   off_t file_offset, off_t bufPtr_offset);
using PFN_cuFileWrite = ssize_t (*)(CUfileHandle_t fh, const void* bufPtr_base, std::size_t size,
                                    off_t file_offset, off_t bufPtr_offset);

}  // namespace nvio::cuda::abi
