// cuFile (GPUDirect Storage), loaded with dlopen on first use. The decision of how device memory
// moves for an operation is in cuda/transport.hpp.
//
// Thread-safety: the library and its driver are opened once per process (std::call_once) and
// stay open until exit (cuFileDriverClose at static-destruction time would race CUDA's own
// teardown). cuFile's read/write/handle/buffer calls are thread-safe. The buffer registry is
// guarded by a mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cuda/cuda_abi.hpp"
#include "cuda/library.hpp"
#include "cuda/transport.hpp"
#include "nvio/gpu.hpp"
#include "nvio/options.hpp"

namespace nvio::cuda {

inline constexpr const char* kCuFileEnv = "NVIO_CUFILE_LIBRARY";

struct CuFile {
  Library lib;
  bool loaded = false;  // library and every symbol present
  std::string reason;
  abi::PFN_cuFileDriverOpen driver_open = nullptr;
  abi::PFN_cuFileDriverGetProperties driver_get_properties = nullptr;
  abi::PFN_cuFileHandleRegister handle_register = nullptr;
  abi::PFN_cuFileHandleDeregister handle_deregister = nullptr;
  abi::PFN_cuFileBufRegister buf_register = nullptr;
  abi::PFN_cuFileBufDeregister buf_deregister = nullptr;
  abi::PFN_cuFileRead read = nullptr;
  abi::PFN_cuFileWrite write = nullptr;
};

CuFile load_cufile(Library lib);
// The process's cuFile library (loaded, not yet driver-opened), on first call.
const CuFile& cufile();

// "CU_FILE_IO_NOT_SUPPORTED" and a short description for a CUfileOpError value.
std::string cufile_error_name(int err);
std::string cufile_error_text(int err);
// The message of a CUfileError_t: the cuFile error, and the CUDA error when it carries one.
std::string describe(const abi::CUfileError_t& status);

// The GDS mode from what was found: whether cuFileDriverOpen worked (and its error), whether
// nvidia-fs is loaded, and the driver properties' P2PDMA flag. Pure, for tests.
GdsMode classify_gds(bool driver_opened, bool nvidia_fs_present, bool p2pdma_flag,
                     std::string& reason);

// A file descriptor registered with cuFile (cuFileHandleRegister) for its lifetime (move-only).
class CuFileHandle {
 public:
  CuFileHandle() = default;
  // Throws GpuError (with the cuFile error) when cuFile refuses the descriptor.
  CuFileHandle(int fd, const std::string& path);
  ~CuFileHandle();
  CuFileHandle(CuFileHandle&& o) noexcept;
  CuFileHandle& operator=(CuFileHandle&& o) noexcept;
  CuFileHandle(const CuFileHandle&) = delete;
  CuFileHandle& operator=(const CuFileHandle&) = delete;
  explicit operator bool() const noexcept { return handle_ != nullptr; }
  abi::CUfileHandle_t get() const noexcept { return handle_; }

 private:
  abi::CUfileHandle_t handle_ = nullptr;
};

// One synchronous cuFileRead / cuFileWrite of [buf, buf + length) at `file_offset`, through a
// registered buffer when `buf` lies inside one. Returns bytes moved (possibly fewer), or -errno,
// or -(CUfileOpError) as cuFile does.
std::int64_t gds_transfer(const CuFileHandle& fh, bool is_read, void* buf, std::size_t length,
                          std::uint64_t file_offset);

}  // namespace nvio::cuda
