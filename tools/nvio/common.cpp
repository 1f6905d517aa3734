// Helpers that more than one subcommand uses.
#include <fmt/core.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "cli.hpp"
#include "nvio/gpu.hpp"
#include "nvio/interrupt.hpp"
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

namespace {

// The first number of a one-line file such as memory.max; nullopt for "max" or an unreadable file.
std::optional<std::uint64_t> read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::uint64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

// The least memory.max of the cgroup (v2) of this process and the ones above it; nullopt where no
// level sets one. Not less memory.current: that counts page cache the kernel would reclaim.
std::optional<std::uint64_t> cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<std::uint64_t> limit;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    for (std::filesystem::path dir = "/sys/fs/cgroup" + line.substr(3);; dir = dir.parent_path()) {
      if (const auto max = read_number(dir / "memory.max")) {
        limit = limit ? std::min(*limit, *max) : *max;
      }
      if (dir == "/sys/fs/cgroup" || dir == dir.parent_path()) break;
    }
  }
  return limit;
}

// A "Key:   N kB" line of a /proc file, in bytes.
std::optional<std::uint64_t> proc_kib(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::optional<MemoryRoom> memory_room() {
  std::optional<MemoryRoom> room;
  auto consider = [&room](std::uint64_t bytes, const char* source) {
    if (!room || bytes < room->bytes) room = MemoryRoom{bytes, source};
  };
  if (const auto available = proc_kib("/proc/meminfo", "MemAvailable")) {
    consider(*available, "MemAvailable in /proc/meminfo");
  }
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const std::uint64_t mapped = proc_kib("/proc/self/status", "VmSize").value_or(0);
    consider(lim.rlim_cur > mapped ? lim.rlim_cur - mapped : 0,
             "the address-space limit RLIMIT_AS (ulimit -v) less what is mapped");
  }
  if (const auto cgroup = cgroup_limit()) consider(*cgroup, "the cgroup's limit memory.max");
  return room;
}

void add_device_option(CLI::App& app, std::string& device, bool& given) {
  app.add_option("--device", device, "With --gpu: the CUDA device ordinal")
      ->type_name("N")
      ->capture_default_str()
      ->each([&given](const std::string&) { given = true; });
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

// ---- signals ------------------------------------------------------------------------------------

namespace {

constexpr std::array<int, 3> kStopSignals{SIGINT, SIGTERM, SIGHUP};
// Written by the handler, read by the waiting threads' checks: a lock-free atomic is both
// async-signal-safe and free of data races.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_stop_signal(int sig) { g_stop_signal.store(sig); }

class SignalRecorded final : public nvio::InterruptCheck {
 public:
  bool interrupted() noexcept override { return g_stop_signal.load() != 0; }
};
SignalRecorded g_signal_recorded;

}  // namespace

struct StopOnSignals::Saved {
  std::array<struct sigaction, kStopSignals.size()> actions{};
  std::array<bool, kStopSignals.size()> installed{};
  nvio::ScopedInterruptCheck check{g_signal_recorded};
};

StopOnSignals::StopOnSignals() : saved_(new Saved) {
  g_stop_signal.store(0);
  struct sigaction act {};
  act.sa_handler = record_stop_signal;
  // SA_RESETHAND: a second signal acts at once (kills), should the stop itself hang on a dead
  // drive. SA_RESTART: the main thread's other system calls go on; the waits ask the check anyway.
  act.sa_flags = SA_RESETHAND | SA_RESTART;
  ::sigemptyset(&act.sa_mask);
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
    struct sigaction old {};
    // A signal the process was started with ignored (nohup's SIGHUP, SIGINT of a background
    // job) stays ignored.
    if (::sigaction(kStopSignals[i], nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    saved_->installed[i] = ::sigaction(kStopSignals[i], &act, &saved_->actions[i]) == 0;
  }
}

StopOnSignals::~StopOnSignals() {
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) {
    if (saved_->installed[i]) ::sigaction(kStopSignals[i], &saved_->actions[i], nullptr);
  }
  delete saved_;
  // A signal after the library's last wait (while the results were printed) stopped nothing: it
  // still ends the process, as it would have without the handler. During unwinding from the
  // Interrupted it caused, report_current_exception() does that, after its message.
  const int sig = g_stop_signal.load();
  if (sig != 0 && std::uncaught_exceptions() == 0) end_by_signal(sig);
}

int stop_signal() noexcept { return g_stop_signal.load(); }

void end_by_signal(int sig) {
  std::fflush(stdout);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace nvio_cli
