// Helpers that more than one subcommand uses.
#include <fmt/core.h>

#include <filesystem>
#include <system_error>

#include "cli.hpp"
#include "nvio/gpu.hpp"

namespace nvio_cli {

void make_directory(const std::string& dir) {
  std::error_code ec;
  // An empty name or an existing path of another kind is left for the run to report (it says
  // what it needed).
  if (dir.empty() || std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) return;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::filesystem::filesystem_error("--dir: cannot create the directory", dir, ec);
}

void require_gpu(int device) {
  const nvio::GpuInfo& gpu = nvio::gpu_info();
  if (!gpu.usable()) throw UsageError("--gpu: no usable GPU here: " + gpu.driver_reason);
  if (device < 0 || static_cast<std::size_t>(device) >= gpu.devices.size()) {
    throw UsageError(
        fmt::format("--device: {} is not a GPU here ({} found)", device, gpu.devices.size()));
  }
}

}  // namespace nvio_cli
