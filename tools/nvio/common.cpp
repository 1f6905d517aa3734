// Helpers that more than one subcommand uses.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <limits>
#include <system_error>

#include "cli.hpp"
#include "nvio/gpu.hpp"
#include "nvio/options.hpp"

namespace nvio_cli {

void make_directory(const std::string& dir) {
  std::error_code ec;
  // An empty name or an existing path of another kind is left for the run to report (it says
  // what it needed).
  if (dir.empty() || std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) return;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::filesystem::filesystem_error("--dir: cannot create the directory", dir, ec);
}

void add_device_option(CLI::App& app, std::string& device) {
  app.add_option("--device", device, "With --gpu: the CUDA device ordinal")
      ->type_name("N")
      ->capture_default_str();
}

int parse_device(const std::string& text) {
  const std::size_t device = nvio::parse_count(text, "--device");
  if (device > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw UsageError(fmt::format("--device: {} is out of range", text));
  }
  return static_cast<int>(device);
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
