// The tuner's real measurer: trials that read and write a scratch file with nvio::Handle.
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>

#include "core/posix.hpp"
#include "core/unique_name.hpp"
#include "nvio/config.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"
#include "nvio/handle.hpp"
#include "nvio/memory.hpp"
#include "nvio/pattern.hpp"
#include "nvio/system.hpp"
#include "nvio/tune.hpp"

namespace nvio {
namespace {

using Clock = std::chrono::steady_clock;

std::string filesystem_name(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  static const std::map<unsigned long, const char*> kNames = {
      {0xEF53, "ext4"},      {0x58465342, "xfs"},  {0x9123683E, "btrfs"},   {0x01021994, "tmpfs"},
      {0x858458f6, "ramfs"}, {0x6969, "nfs"},      {0x794c7630, "overlay"}, {0xF2F52010, "f2fs"},
      {0x2fc12fc1, "zfs"},   {0xff534d42, "cifs"}, {0x65735546, "fuse"},    {0x4d44, "vfat"}};
  const auto it = kNames.find(static_cast<unsigned long>(fs.f_type));
  return it == kNames.end() ? fmt::format("0x{:x}", static_cast<unsigned long>(fs.f_type))
                            : it->second;
}

// The kernel's name for the block device holding `dir` (the whole disk for a partition), or "".
std::string block_device_name(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return {};
  std::error_code ec;
  const auto link = std::filesystem::canonical(
      fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev)), ec);
  if (ec) return {};
  if (std::filesystem::exists(link / "partition", ec)) return link.parent_path().filename();
  return link.filename();
}

// Warnings about results that may not reflect the drive.
void add_cache_warnings(TuneResult& r) {
  if (r.filesystem == "tmpfs" || r.filesystem == "ramfs") {
    r.warnings.push_back(fmt::format(
        "{} is on {}: the file lives in memory, so these figures measure memory, not a drive",
        r.directory, r.filesystem));
    return;
  }
  const std::string dev = block_device_name(r.directory);
  for (const char* prefix : {"vd", "xvd", "loop", "nbd", "rbd", "zram", "ram"}) {
    if (dev.rfind(prefix, 0) == 0) {
      r.warnings.push_back(fmt::format(
          "{} is on {}, a virtual or memory-backed device: the host may cache it, so the figures "
          "can exceed what the physical drive sustains",
          r.directory, dev));
      return;
    }
  }
}

constexpr std::uint64_t kPatternSeed = 0x7475'6e65;

class FileMeasurer final : public Measurer {
 public:
  // Trials move `device` memory when it is set, else a host buffer of their own.
  FileMeasurer(std::string path, std::uint64_t file_size, std::uint64_t trial_bytes,
               Clock::time_point start, const std::optional<TuneDeviceMemory>& device)
      : path_(std::move(path)),
        file_size_(file_size),
        trial_(trial_bytes),
        start_(start),
        memory_(device ? MemoryKind::Device : MemoryKind::Host) {
    if (device) {
      data_ = device->data;
      // Untimed: the write trials then carry the file's pattern rather than whatever the device
      // memory held.
      Handle(Options{}).read(data_, trial_, path_, 0, ReadOptions{memory_});
    } else {
      buffer_ = AlignedBuffer(static_cast<std::size_t>(trial_bytes), LockMode::Try);
      pattern::fill(buffer_.data(), buffer_.size(), 0, kPatternSeed);
      data_ = buffer_.data();
    }
  }

  TuneSample measure(const Options& options, TuneMode mode) override {
    Handle handle(options);  // threads and rings are set up outside the timed part
    // Trials walk through the file so that consecutive ones touch different ranges.
    const std::uint64_t slots = std::max<std::uint64_t>(1, file_size_ / trial_);
    const std::uint64_t offset = (next_slot_++ % slots) * trial_;
    evict(offset);
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    if (mode == TuneMode::Read) {
      handle.read(data_, trial_, path_, offset, ReadOptions{memory_});
    } else {
      // fdatasync at the end: the time until the data is on the drive, not in the page cache.
      handle.write(data_, trial_, path_, offset,
                   WriteOptions{Truncate::No, Durability::Data, memory_});
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    TuneSample s;
    s.cpu_seconds = process_cpu_seconds() - cpu0;
    s.bytes = double(trial_);
    s.gbps = s.bytes / std::max(secs, 1e-9) / 1e9;
    if (mode == TuneMode::Write) evict(offset);
    return s;
  }

  double now() override { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  // Drops the range from the page cache so that a buffered read comes from the drive. The data
  // is clean (written with fdatasync), so no root and no cache-wide drop are needed. Best effort:
  // a failure only makes the next trial look faster.
  void evict(std::uint64_t offset) { detail::evict_page_cache(path_, offset, trial_); }

  std::string path_;
  std::uint64_t file_size_;
  std::uint64_t trial_;
  Clock::time_point start_;
  MemoryKind memory_;
  AlignedBuffer buffer_;  // host trials only
  void* data_ = nullptr;  // what the trials move: buffer_ or the caller's device memory
  std::uint64_t next_slot_ = 0;
};

// Removes the scratch file when tuning ends, however it ends.
class ScratchFile {
 public:
  ScratchFile(std::string path, bool keep) : path_(std::move(path)), keep_(keep) {}
  ~ScratchFile() {
    if (!keep_) ::unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

bool tries_cufile(const TuneSpace& space) {
  return std::ranges::find(space.gpu_direct, GpuDirect::On) != space.gpu_direct.end();
}

// The device memory's own checks, before anything is written.
void check_device_memory(const TuneRequest& request) {
  const auto& device = request.device_memory;
  if (!device) {
    if (tries_cufile(request.space)) {
      throw InvalidArgument(
          "gpu_direct on moves device memory: tuning it needs device memory for the trials");
    }
    return;
  }
  if (device->data == nullptr || device->size == 0) {
    throw InvalidArgument(fmt::format("the device memory for the trials is empty ({} bytes at {})",
                                      device->size, device->data));
  }
  if (request.trial_bytes > device->size) {
    throw InvalidArgument(fmt::format("trial size {} is larger than the device memory, {} bytes",
                                      request.trial_bytes, device->size));
  }
}

}  // namespace

std::uint64_t max_auto_trial_bytes(std::uint64_t file_size) noexcept {
  const std::uint64_t floor = 32 << 20;
  return std::min(file_size, std::max(floor, file_size / 4));
}

TuneResult tune_directory(const TuneRequest& request) {
  const auto start = Clock::now();
  request.space.validate();
  check_device_memory(request);
  for (EngineKind e : request.space.engines) {
    const EngineProbe& probe = probe_engine(e);
    if (!probe.available) {
      throw EngineUnavailable(
          fmt::format("engine {} is not available here ({}): leave it out of "
                      "the engines to tune",
                      to_string(e), probe.reason));
    }
  }
  const std::string& dir = request.directory;
  if (dir.empty()) throw InvalidArgument("tuning needs a directory");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw_io_error(IoOp::Stat, dir, 0, 0, errno);
  if (!S_ISDIR(st.st_mode)) {
    throw InvalidArgument(
        fmt::format("{}: not a directory (tune needs a directory to put its "
                    "scratch file in)",
                    dir));
  }
  const std::uint64_t mib = 1 << 20;
  if (request.file_size < 16 * mib) {
    throw InvalidArgument(
        fmt::format("tuning file size must be at least 16 MiB, got {} bytes", request.file_size));
  }
  if (request.trial_bytes > request.file_size) {
    throw InvalidArgument(fmt::format("trial size {} is larger than the file size {}",
                                      request.trial_bytes, request.file_size));
  }
  if (const std::optional<std::uint64_t> free = free_space(dir)) {
    const std::uint64_t free_bytes = *free;
    // 64 MiB to spare, for the file system's own blocks and other writers. Compared without a
    // sum that could wrap (a size near 2^64 passed as 0 + 64 MiB and filled the drive).
    const std::uint64_t spare = 64 * mib;
    if (free_bytes < spare || request.file_size > free_bytes - spare) {
      throw NoSpace(IoOp::Write, dir, 0, request.file_size, ENOSPC,
                    fmt::format("only {} bytes are free; the tuning file needs {} and 64 MiB to "
                                "spare (use a smaller size)",
                                free_bytes, request.file_size));
    }
  }

  TuneSpace space = request.space;
  const DirectIoInfo dio = probe_directory(dir);
  TuneResult pre;
  pre.directory = dir;
  pre.device = device_key(dir);
  pre.filesystem = filesystem_name(dir);
  pre.file_size = request.file_size;
  if (!dio.supported) {
    std::erase(space.direct, DirectIo::On);
    pre.warnings.push_back(fmt::format(
        "{} does not support O_DIRECT ({}): only buffered I/O was measured", dir, dio.source));
    if (space.direct.empty()) space.direct.push_back(DirectIo::Off);
  }
  add_cache_warnings(pre);
  if (tries_cufile(space) && gpu_info().gds_mode == GdsMode::Unavailable) {
    pre.warnings.push_back(fmt::format(
        "cuFile cannot be used here ({}): the gpu_direct on trials moved device memory through the "
        "host bounce path, as gpu_direct off does",
        gpu_info().gds_reason));
  }

  ScratchFile file(fmt::format("{}/nvio-tune.{}.dat", dir, detail::unique_suffix()),
                   request.keep_file);
  // Create the file with data (not a sparse hole, which reads back without touching the drive)
  // and note how fast that went, to size the trials.
  std::uint64_t trial = request.trial_bytes;
  {
    const std::size_t chunk =
        static_cast<std::size_t>(std::min<std::uint64_t>(request.file_size, 64 * mib));
    AlignedBuffer buf(chunk, LockMode::Try);
    Options o;
    o.direct = dio.supported ? DirectIo::On : DirectIo::Off;
    Handle h(o);
    const auto t0 = Clock::now();
    for (std::uint64_t off = 0; off < request.file_size; off += chunk) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(chunk, request.file_size - off));
      pattern::fill(buf.data(), n, off, 0x7475'6e65);
      const bool last = off + n == request.file_size;
      h.write(buf.data(), n, file.path(), off,
              WriteOptions{last ? Truncate::AtEnd : Truncate::No,
                           last ? Durability::Data : Durability::None});
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (trial == 0) {
      const double speed = double(request.file_size) / std::max(secs, 1e-6);
      const std::uint64_t want = static_cast<std::uint64_t>(speed * 0.25) / mib * mib;
      trial = std::min(std::max<std::uint64_t>(want, 32 * mib),
                       max_auto_trial_bytes(request.file_size));
      if (request.device_memory)
        trial = std::min<std::uint64_t>(trial, request.device_memory->size);
    }
  }
  if (trial < 64 * mib) {
    pre.warnings.push_back(fmt::format(
        "trials move only {} MiB each: small transfers make the figures noisier", trial / mib));
  }

  FileMeasurer measurer(file.path(), request.file_size, trial, start, request.device_memory);
  TuneResult result = search(space, measurer, request.settings);
  result.memory = request.device_memory ? MemoryKind::Device : MemoryKind::Host;
  result.directory = pre.directory;
  result.device = pre.device;
  result.filesystem = pre.filesystem;
  result.file_size = request.file_size;
  result.trial_bytes = trial;
  result.warnings = std::move(pre.warnings);
  return result;
}

}  // namespace nvio
