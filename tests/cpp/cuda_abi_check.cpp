// Compile-time check of nvio's hand-written CUDA declarations (src/cuda/cuda_abi.hpp) against the
// real headers: every constant must equal the header's, and every function-pointer type must be
// exactly the real function's type once the real handle types are replaced by nvio's stand-ins.
// Built only where a CUDA toolkit is installed; nothing here runs.
#include <cuda.h>

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "cuda/cuda_abi.hpp"
#include "cuda/device_ops.hpp"

namespace abi = nvio::cuda::abi;

static_assert(sizeof(abi::CUresult) == sizeof(CUresult));
static_assert(std::is_same_v<abi::CUdevice, CUdevice>);
static_assert(std::is_same_v<abi::CUdeviceptr, CUdeviceptr>);
static_assert(sizeof(abi::CUpointer_attribute) == sizeof(CUpointer_attribute));

static_assert(abi::CUDA_SUCCESS == CUDA_SUCCESS);
static_assert(abi::CUDA_ERROR_INVALID_VALUE == CUDA_ERROR_INVALID_VALUE);
static_assert(abi::CUDA_ERROR_NOT_INITIALIZED == CUDA_ERROR_NOT_INITIALIZED);
static_assert(abi::CUDA_ERROR_NO_DEVICE == CUDA_ERROR_NO_DEVICE);
static_assert(abi::CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY);
static_assert(abi::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
static_assert(nvio::cuda::kNotReady == CUDA_ERROR_NOT_READY);
static_assert(abi::CU_POINTER_ATTRIBUTE_MEMORY_TYPE == CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
static_assert(abi::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
static_assert(abi::CU_MEMORYTYPE_HOST == CU_MEMORYTYPE_HOST);
static_assert(abi::CU_MEMORYTYPE_DEVICE == CU_MEMORYTYPE_DEVICE);
static_assert(abi::CU_MEMORYTYPE_ARRAY == CU_MEMORYTYPE_ARRAY);
static_assert(abi::CU_MEMORYTYPE_UNIFIED == CU_MEMORYTYPE_UNIFIED);
static_assert(sizeof(unsigned) == sizeof(CUmemorytype));  // what the MEMORY_TYPE query writes
static_assert(abi::kMemHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE);
static_assert(abi::CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING);
static_assert(abi::CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING);

// Real types -> nvio's stand-ins; everything else stays as it is.
template <typename T>
struct Ours {
  using type = T;
};
template <>
struct Ours<CUresult> {
  using type = abi::CUresult;
};
template <>
struct Ours<CUpointer_attribute> {
  using type = abi::CUpointer_attribute;
};
template <>
struct Ours<CUcontext> {
  using type = abi::CUcontext;
};
template <>
struct Ours<CUcontext*> {
  using type = abi::CUcontext*;
};
template <>
struct Ours<CUstream> {
  using type = abi::CUstream;
};
template <>
struct Ours<CUstream*> {
  using type = abi::CUstream*;
};
template <>
struct Ours<CUevent> {
  using type = abi::CUevent;
};
template <>
struct Ours<CUevent*> {
  using type = abi::CUevent*;
};
template <typename R, typename... A>
struct Ours<R (*)(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};

#define NVIO_SAME(pfn, real) \
  static_assert(std::is_same_v<Ours<decltype(&real)>::type, abi::pfn>, #real)

NVIO_SAME(PFN_cuGetErrorName, cuGetErrorName);
NVIO_SAME(PFN_cuGetErrorString, cuGetErrorString);
NVIO_SAME(PFN_cuInit, cuInit);
NVIO_SAME(PFN_cuDriverGetVersion, cuDriverGetVersion);
NVIO_SAME(PFN_cuDeviceGetCount, cuDeviceGetCount);
NVIO_SAME(PFN_cuDeviceGet, cuDeviceGet);
NVIO_SAME(PFN_cuDeviceGetName, cuDeviceGetName);
NVIO_SAME(PFN_cuDeviceTotalMem_v2, cuDeviceTotalMem_v2);
NVIO_SAME(PFN_cuDeviceGetPCIBusId, cuDeviceGetPCIBusId);
NVIO_SAME(PFN_cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
NVIO_SAME(PFN_cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2);
NVIO_SAME(PFN_cuCtxSetCurrent, cuCtxSetCurrent);
NVIO_SAME(PFN_cuCtxGetCurrent, cuCtxGetCurrent);
NVIO_SAME(PFN_cuPointerGetAttribute, cuPointerGetAttribute);
NVIO_SAME(PFN_cuMemHostRegister_v2, cuMemHostRegister_v2);
NVIO_SAME(PFN_cuMemHostUnregister, cuMemHostUnregister);
NVIO_SAME(PFN_cuMemAlloc_v2, cuMemAlloc_v2);
NVIO_SAME(PFN_cuMemFree_v2, cuMemFree_v2);
NVIO_SAME(PFN_cuMemcpyHtoD_v2, cuMemcpyHtoD_v2);
NVIO_SAME(PFN_cuMemcpyDtoH_v2, cuMemcpyDtoH_v2);
NVIO_SAME(PFN_cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2);
NVIO_SAME(PFN_cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2);
NVIO_SAME(PFN_cuStreamCreate, cuStreamCreate);
NVIO_SAME(PFN_cuStreamDestroy_v2, cuStreamDestroy_v2);
NVIO_SAME(PFN_cuEventCreate, cuEventCreate);
NVIO_SAME(PFN_cuEventRecord, cuEventRecord);
NVIO_SAME(PFN_cuEventQuery, cuEventQuery);
NVIO_SAME(PFN_cuEventSynchronize, cuEventSynchronize);
NVIO_SAME(PFN_cuEventDestroy_v2, cuEventDestroy_v2);

// The names nvio looks up are the ones cuda.h maps the plain API names to.
#define NVIO_STR2(x) #x
#define NVIO_STR(x) NVIO_STR2(x)
static_assert(std::string_view(NVIO_STR(cuMemAlloc)) == "cuMemAlloc_v2");
static_assert(std::string_view(NVIO_STR(cuMemFree)) == "cuMemFree_v2");
static_assert(std::string_view(NVIO_STR(cuDeviceTotalMem)) == "cuDeviceTotalMem_v2");
static_assert(std::string_view(NVIO_STR(cuMemHostRegister)) == "cuMemHostRegister_v2");
static_assert(std::string_view(NVIO_STR(cuStreamDestroy)) == "cuStreamDestroy_v2");
static_assert(std::string_view(NVIO_STR(cuEventDestroy)) == "cuEventDestroy_v2");
static_assert(std::string_view(NVIO_STR(cuMemcpyHtoDAsync)) == "cuMemcpyHtoDAsync_v2");
static_assert(std::string_view(NVIO_STR(cuMemcpyDtoHAsync)) == "cuMemcpyDtoHAsync_v2");
static_assert(std::string_view(NVIO_STR(cuMemcpyHtoD)) == "cuMemcpyHtoD_v2");
static_assert(std::string_view(NVIO_STR(cuMemcpyDtoH)) == "cuMemcpyDtoH_v2");

#if __has_include(<cufile.h>)
#include <cufile.h>
static_assert(abi::CU_FILE_SUCCESS == CU_FILE_SUCCESS);
static_assert(abi::kCuFileOpBaseErr == CUFILEOP_BASE_ERR);
static_assert(abi::CU_FILE_CUDA_DRIVER_ERROR == CU_FILE_CUDA_DRIVER_ERROR);
static_assert(abi::CU_FILE_HANDLE_TYPE_OPAQUE_FD == CU_FILE_HANDLE_TYPE_OPAQUE_FD);
static_assert(abi::CU_FILE_ALLOW_COMPAT_MODE == CU_FILE_ALLOW_COMPAT_MODE);
static_assert(abi::CU_FILE_P2P_SUPPORTED == CU_FILE_P2P_SUPPORTED);
static_assert(sizeof(abi::CUfileError_t) == sizeof(CUfileError_t));
static_assert(sizeof(abi::CUfileDescr_t) == sizeof(CUfileDescr_t));
static_assert(offsetof(abi::CUfileDescr_t, fs_ops) == offsetof(CUfileDescr_t, fs_ops));
static_assert(sizeof(abi::CUfileDrvProps_t) == sizeof(CUfileDrvProps_t));
static_assert(offsetof(abi::CUfileDrvProps_t, fflags) == offsetof(CUfileDrvProps_t, fflags));
static_assert(std::is_same_v<decltype(&cuFileRead), abi::PFN_cuFileRead>);
static_assert(std::is_same_v<decltype(&cuFileWrite), abi::PFN_cuFileWrite>);
static_assert(std::is_same_v<decltype(&cuFileBufRegister), abi::PFN_cuFileBufRegister>);
static_assert(std::is_same_v<decltype(&cuFileBufDeregister), abi::PFN_cuFileBufDeregister>);
static_assert(std::is_same_v<decltype(&cuFileHandleDeregister), abi::PFN_cuFileHandleDeregister>);
#endif
