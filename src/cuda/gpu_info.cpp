// gpu_info(): what the machine offers for device memory, probed once, never throwing.
#include <fmt/format.h>
#include <sys/stat.h>

#include <filesystem>
#include <mutex>
#include <system_error>

#include "cuda/cufile.hpp"
#include "cuda/driver.hpp"
#include "nvio/gpu.hpp"

namespace nvio {

const char* to_string(GdsMode mode) noexcept {
  switch (mode) {
    case GdsMode::Unavailable: return "unavailable";
    case GdsMode::Compatibility: return "compatibility";
    case GdsMode::P2P: return "p2p";
  }
  return "?";
}

namespace {

// nvidia-fs, the kernel module of GPUDirect Storage, shows itself in /proc and /dev.
bool nvidia_fs_present() {
  std::error_code ec;
  if (std::filesystem::exists("/proc/driver/nvidia-fs", ec)) return true;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    if (entry.path().filename().string().rfind("nvidia-fs", 0) == 0) return true;
  }
  return false;
}

std::optional<int> runtime_version(std::string& path) {
  cuda::Library rt = cuda::Library::load(
      "NVIO_CUDA_RUNTIME_LIBRARY",
      {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"});
  path = rt.path();
  if (!rt) return std::nullopt;
  auto fn =
      reinterpret_cast<cuda::abi::PFN_cudaRuntimeGetVersion>(rt.symbol("cudaRuntimeGetVersion"));
  int v = 0;
  if (fn == nullptr || fn(&v) != 0) return std::nullopt;
  return v;
}

GpuInfo probe() {
  GpuInfo info;
  const cuda::Driver& d = cuda::driver();
  info.driver_path = d.lib.path();
  info.driver_loaded = d.ok;
  info.driver_reason = d.reason;
  if (d.ok) {
    d.driver_get_version(&info.driver_version);
    int count = 0;
    if (const int rc = d.device_get_count(&count); rc != cuda::abi::CUDA_SUCCESS) {
      info.driver_reason = fmt::format("cuDeviceGetCount: {}", d.error_name(rc));
      count = 0;
    }
    for (int i = 0; i < count; ++i) {
      GpuDevice dev;
      dev.ordinal = i;
      cuda::abi::CUdevice handle = 0;
      if (d.device_get(&handle, i) != cuda::abi::CUDA_SUCCESS) continue;
      char name[256] = {};
      if (d.device_get_name(name, sizeof name - 1, handle) == cuda::abi::CUDA_SUCCESS) {
        dev.name = name;
      }
      std::size_t bytes = 0;
      if (d.device_total_mem(&bytes, handle) == cuda::abi::CUDA_SUCCESS) dev.total_memory = bytes;
      char bus[64] = {};
      if (d.device_get_pci_bus_id(bus, sizeof bus - 1, handle) == cuda::abi::CUDA_SUCCESS) {
        dev.pci_bus_id = bus;
      }
      info.devices.push_back(std::move(dev));
    }
    if (count == 0 && info.driver_reason == "loaded") info.driver_reason = "loaded; no devices";
  }
  info.runtime_version = runtime_version(info.runtime_path);

  const cuda::CuFile& c = cuda::cufile();
  info.cufile_path = c.lib.path();
  info.cufile_loaded = c.loaded;
  info.cufile_reason = c.reason;
  if (!c.loaded) {
    info.gds_reason = "cuFile not loaded: " + c.reason;
  } else if (!info.usable()) {
    info.gds_reason = "no usable GPU: " + info.driver_reason;
  } else {
    const cuda::abi::CUfileError_t st = c.driver_open();
    bool p2pdma = false;
    if (st.err != cuda::abi::CU_FILE_SUCCESS) {
      info.gds_reason = fmt::format("cuFileDriverOpen: {}: {}", cuda::cufile_error_name(st.err),
                                    cuda::describe(st));
    } else {
      cuda::abi::CUfileDrvProps_t props{};
      if (c.driver_get_properties(&props).err == cuda::abi::CU_FILE_SUCCESS) {
        p2pdma = (props.fflags & (1u << cuda::abi::CU_FILE_P2P_SUPPORTED)) != 0;
      }
    }
    info.gds_mode = cuda::classify_gds(st.err == cuda::abi::CU_FILE_SUCCESS, nvidia_fs_present(),
                                       p2pdma, info.gds_reason);
  }
  return info;
}

}  // namespace

const GpuInfo& gpu_info() {
  static const GpuInfo* info = new GpuInfo(probe());
  return *info;
}

}  // namespace nvio
