// `nvio bench`: times handle.write / handle.read of one buffer to one file and reports GB/s.
//
// Each loop moves the whole buffer once. Wall time comes from steady_clock; CPU time from
// getrusage(RUSAGE_SELF), which includes the library's worker threads (they live in this process).
// Reported figures are medians over loops, so one slow loop (a flush, a noisy neighbour) does not
// skew the result. The JSON's per-result "stats" are the handle's counters (Handle::stats()) over
// the timed loops only: the difference of snapshots taken around them, leaving out the untimed
// operations (laying out the file, verifying a write) that use the same handle.
//
// This file holds the sequential operations and the command itself; bench_impl.hpp says where the
// other parts are.
#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "bench_impl.hpp"
#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"
#include "nvio/handle.hpp"
#include "nvio/memory.hpp"
#include "nvio/options.hpp"
#include "nvio/pattern.hpp"
#include "nvio/stripe.hpp"
#include "nvio/system.hpp"
#include "procs.hpp"

namespace nvio_cli {
namespace bench {

// ---- files --------------------------------------------------------------------------------------

std::optional<std::uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_size);
}

namespace {

// The scratch files to remove if the run is interrupted (Ctrl-C), so that multi-GiB files are not
// left behind: one, or a striped file's parts. Only async-signal-safe calls are made from the
// handler.
constexpr std::size_t kMaxCleanupPaths = 64;
volatile std::sig_atomic_t g_cleanup_count = 0;
char g_cleanup_paths[kMaxCleanupPaths][4096];

extern "C" void remove_and_reraise(int sig) {
  for (std::sig_atomic_t i = 0; i < g_cleanup_count; ++i) ::unlink(g_cleanup_paths[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Removes the files at the end of the run (also on errors and SIGINT/SIGTERM/SIGHUP) unless they
// must stay: --keep, or a --file that existed before we started (it may be the user's data, not
// ours).
class FileCleanup {
 public:
  FileCleanup(std::vector<std::string> paths, bool remove)
      : paths_(std::move(paths)), remove_(remove) {
    if (!remove_ || paths_.size() > kMaxCleanupPaths) return;
    for (const std::string& p : paths_) {
      if (p.size() >= sizeof g_cleanup_paths[0]) return;
    }
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      std::memcpy(g_cleanup_paths[i], paths_[i].c_str(), paths_[i].size() + 1);
    }
    g_cleanup_count = static_cast<std::sig_atomic_t>(paths_.size());
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {  // SIGHUP: the terminal closed
      // One the process was started with ignored (nohup's SIGHUP) stays ignored.
      if (std::signal(sig, remove_and_reraise) == SIG_IGN) std::signal(sig, SIG_IGN);
    }
  }
  ~FileCleanup() {
    g_cleanup_count = 0;
    if (!remove_) return;
    for (const std::string& p : paths_) ::unlink(p.c_str());
  }
  FileCleanup(const FileCleanup&) = delete;
  FileCleanup& operator=(const FileCleanup&) = delete;

 private:
  std::vector<std::string> paths_;
  bool remove_;
};

// ---- the operations -----------------------------------------------------------------------------

// The memory a run moves: a locked host buffer, and for --gpu a device buffer the I/O uses, with
// the host buffer staging the pattern in and out of it (untimed).
struct Buffers {
  explicit Buffers(const Plan& plan) : host(plan.size, nvio::LockMode::Try), size(plan.size) {
    if (plan.memory == Plan::Memory::Device) device.emplace(plan.size, plan.device);
  }
  void* io() const { return device ? device->data() : host.data(); }
  // The host bytes to the I/O buffer, and back.
  void push() {
    if (device) device->copy_from_host(host.data(), size);
  }
  void pull() {
    if (device) device->copy_to_host(host.data(), size);
  }
  nvio::MemoryKind memory() const {
    return device ? nvio::MemoryKind::Device : nvio::MemoryKind::Host;
  }
  nvio::ReadOptions read_options() const {
    nvio::ReadOptions r;
    r.memory = memory();
    return r;
  }
  nvio::WriteOptions write_options() const {
    nvio::WriteOptions w;
    w.memory = memory();
    return w;
  }
  nvio::AlignedBuffer host;
  std::optional<nvio::DeviceBuffer> device;
  std::size_t size;
};

// Records whether the buffer holds the pattern, and where it first does not.
void check_pattern(Buffers& buf, const Plan& plan, OpResult& result) {
  buf.pull();
  result.bad_offset =
      nvio::pattern::first_mismatch(buf.host.data(), plan.size, plan.offset, plan.seed);
  result.verified = !result.bad_offset;
}

// Where a sequential run moves its bytes: plan.path through the handle, or with several --dir the
// file plan.path striped over them through a StripedHandle (one handle per drive, each with its
// drive's saved profile under the flags), whose per-drive times the samples keep.
class Target {
 public:
  Target(nvio::Handle& handle, const Plan& plan) : handle_(handle), plan_(plan) {
    if (!plan.stripe_dirs.empty()) {
      std::vector<nvio::Options> per_drive;
      for (const nvio::EffectiveOptions& o : plan.drive_options) per_drive.push_back(o.values);
      striped_.emplace(nvio::StripeLayout{plan.stripe_dirs, plan.stripe_size}, per_drive);
    }
  }
  // The files the run may create.
  static std::vector<std::string> paths(const Plan& plan) {
    if (plan.stripe_dirs.empty()) return {plan.path};
    const nvio::StripeLayout layout{plan.stripe_dirs, plan.stripe_size};
    std::vector<std::string> out;
    for (std::size_t d = 0; d < plan.stripe_dirs.size(); ++d) {
      out.push_back(layout.part_path(d, plan.path));
    }
    return out;
  }
  // Each drive's share of the run's bytes (empty for one file).
  std::vector<std::uint64_t> drive_bytes() const {
    std::vector<std::uint64_t> out;
    if (!striped_) return out;
    for (std::size_t d = 0; d < plan_.stripe_dirs.size(); ++d) {
      // The bytes of [offset, offset + size) on drive d.
      const nvio::StripeLayout& l = striped_->layout();
      out.push_back(l.part_size(d, plan_.offset + plan_.size) - l.part_size(d, plan_.offset));
    }
    return out;
  }
  // Return each drive's seconds (empty for one file).
  std::vector<double> write(const void* buf, const nvio::WriteOptions& options) {
    if (!striped_) {
      handle_.write(buf, plan_.size, plan_.path, plan_.offset, options);
      return {};
    }
    return drive_seconds(striped_->write(buf, plan_.size, plan_.path, plan_.offset, options));
  }
  std::vector<double> read(void* buf, const nvio::ReadOptions& options) {
    if (!striped_) {
      handle_.read(buf, plan_.size, plan_.path, plan_.offset, options);
      return {};
    }
    return drive_seconds(striped_->read(buf, plan_.size, plan_.path, plan_.offset, options));
  }
  // The file's size, nullopt when missing (or, striped, not one whole striped file).
  std::optional<std::uint64_t> size() const {
    if (!striped_) return file_size(plan_.path);
    try {
      return striped_->size(plan_.path);
    } catch (const nvio::Error&) {
      return std::nullopt;
    }
  }
  nvio::HandleStats stats() const { return striped_ ? striped_->stats() : handle_.stats(); }
  // So that a buffered read really reads the device (best effort, evict_best_effort).
  void evict() const {
    for (const std::string& p : paths(plan_)) evict_best_effort(p);
  }

 private:
  static std::vector<double> drive_seconds(const nvio::StripedTransfer& t) {
    std::vector<double> out;
    for (const nvio::DriveTransfer& d : t.drives) out.push_back(d.seconds);
    return out;
  }
  nvio::Handle& handle_;
  const Plan& plan_;
  std::optional<nvio::StripedHandle> striped_;
};

// One timed call of `target`, with its per-drive times.
template <typename Fn>
Sample time_target(Fn&& fn) {
  std::vector<double> drives;
  Sample s = time_once([&] { drives = fn(); });
  s.drive_seconds = std::move(drives);
  return s;
}

OpResult run_writes(Target& target, Buffers& buf, const Plan& plan, Progress& progress) {
  OpResult result("write", plan.size, target.drive_bytes());
  nvio::pattern::fill(buf.host.data(), plan.size, plan.offset, plan.seed);
  buf.push();
  const nvio::HandleStats before = target.stats();
  nvio::WriteOptions options = buf.write_options();
  if (plan.sync) options.durability = nvio::Durability::Data;
  for (unsigned i = 0; i < plan.loops; ++i) {
    progress.set(fmt::format("write loop {}/{}", i + 1, plan.loops));
    if (plan.gate) plan.gate->wait();
    result.samples.push_back(time_target([&] { return target.write(buf.io(), options); }));
  }
  result.stats = target.stats() - before;
  return result;
}

// A read-only run needs a file to read: write the pattern first (untimed) if the run's own file is
// missing or shorter than --offset + --size.
void ensure_readable(Target& target, Buffers& buf, const Plan& plan) {
  if (plan.existing_size) return;  // the user's file: make_plan checked that it is long enough
  auto size = target.size();
  if (size && *size >= plan.end()) return;
  nvio::pattern::fill(buf.host.data(), plan.size, plan.offset, plan.seed);
  buf.push();
  target.write(buf.io(), buf.write_options());
}

OpResult run_reads(Target& target, Buffers& buf, const Plan& plan, Progress& progress) {
  OpResult result("read", plan.size, target.drive_bytes());
  const nvio::HandleStats before = target.stats();
  for (unsigned i = 0; i < plan.loops; ++i) {
    progress.set(fmt::format("read loop {}/{}", i + 1, plan.loops));
    // Poison the buffer first, or a read that transferred nothing would pass --verify.
    if (plan.verify) {
      std::memset(buf.host.data(), 0xA5, plan.size);
      buf.push();
    }
    target.evict();
    if (plan.gate) plan.gate->wait();
    result.samples.push_back(
        time_target([&] { return target.read(buf.io(), buf.read_options()); }));
    // Every loop's data is checked (untimed); the first failure is the one reported.
    if (plan.verify && result.verified != false) check_pattern(buf, plan, result);
  }
  result.stats = target.stats() - before;
  return result;
}

// For a write-only run: read the file back once (untimed) into a fresh buffer and check it.
void verify_written(Target& target, const Plan& plan, OpResult& result) {
  Buffers back(plan);
  target.evict();
  target.read(back.io(), back.read_options());
  check_pattern(back, plan, result);
}

// --h2d-only: copies between a locked, CUDA-registered host buffer and the device, each way.
std::vector<OpResult> run_copies(const Plan& plan) {
  nvio::AlignedBuffer host(plan.size, nvio::LockMode::Try);
  nvio::HostRegistration pinned(host.data(), plan.size);
  nvio::DeviceBuffer device(plan.size, plan.device);
  nvio::pattern::fill(host.data(), plan.size, 0, plan.seed);
  OpResult h2d("h2d", plan.size);
  OpResult d2h("d2h", plan.size);
  for (unsigned i = 0; i < plan.loops; ++i) {
    h2d.samples.push_back(time_once([&] { device.copy_from_host(host.data(), plan.size); }));
  }
  for (unsigned i = 0; i < plan.loops; ++i) {
    if (plan.verify) std::memset(host.data(), 0xA5, plan.size);
    d2h.samples.push_back(time_once([&] { device.copy_to_host(host.data(), plan.size); }));
    if (plan.verify && d2h.verified != false) {
      d2h.bad_offset = nvio::pattern::first_mismatch(host.data(), plan.size, 0, plan.seed);
      d2h.verified = !d2h.bad_offset;
    }
  }
  if (plan.verify) h2d.verified = d2h.verified;
  return {h2d, d2h};
}

std::vector<OpResult> run_ops(nvio::Handle& handle, const Plan& plan) {
  Buffers buf(plan);
  Target target(handle, plan);
  Progress progress(::isatty(STDERR_FILENO) == 1);
  std::vector<OpResult> results;
  if (plan.op == Op::Read) ensure_readable(target, buf, plan);
  if (plan.op != Op::Read) results.push_back(run_writes(target, buf, plan, progress));
  if (plan.op != Op::Write) results.push_back(run_reads(target, buf, plan, progress));
  if (!plan.verify) return results;
  if (plan.op == Op::Write) {
    verify_written(target, plan, results[0]);
  } else if (plan.op == Op::Both) {
    results[0].verified = results[1].verified;  // the reads checked what the writes stored
  }
  return results;
}

// A run whose file cannot fit is refused before it writes a byte: filling the drive until ENOSPC
// first (83 GB of a shared machine's disk for a mistyped --size) is harm that the error message
// does not undo. Each part of a striped file needs its share (free_space: ramfs is not judged).
void check_free_space(const Plan& plan) {
  const std::vector<std::string> paths = Target::paths(plan);
  const std::uint64_t each = plan.end() / paths.size() + (plan.end() % paths.size() != 0);
  for (const std::string& p : paths) {
    const std::uint64_t have = file_size(p).value_or(0);
    if (have >= each) continue;
    // The file's own file system where it exists (a --file may be a link to another one).
    std::string where = std::filesystem::path(p).parent_path().string();
    if (have > 0 || ::access(p.c_str(), F_OK) == 0) where = p;
    const std::optional<std::uint64_t> free = nvio::free_space(where.empty() ? "." : where);
    if (free && each - have > *free) {
      throw nvio::NoSpace(nvio::IoOp::Write, p, have, each - have, ENOSPC,
                          fmt::format("the run needs {} more bytes there and {} are free (use a "
                                      "smaller --size or --file-size)",
                                      each - have, *free));
    }
  }
}

}  // namespace
}  // namespace bench

int run_bench(const BenchArgs& args) {
  using namespace bench;
  if (wants_procs(args)) return run_bench_procs(args);
  Plan plan = make_plan(args);
  nvio::Handle handle(plan.options.values);
  if (plan.memory == Plan::Memory::H2dOnly) {
    std::vector<OpResult> results = run_copies(plan);
    if (plan.json) {
      print_json(results, handle, plan);
    } else {
      print_table(results, handle, plan);
    }
    return report_verification(results, handle) ? kExitOk : kExitFailure;
  }
  if (plan.pattern == Pattern::Random) check_random_memory(plan);  // before any file or directory
  if (plan.scratch) {
    for (const std::string& p : Target::paths(plan)) {
      make_directory(std::filesystem::path(p).parent_path().string());
    }
  }
  FileCleanup cleanup(Target::paths(plan), !plan.keep && (plan.scratch || !plan.existing_size));
  check_free_space(plan);

  std::vector<OpResult> results =
      plan.pattern == Pattern::Random ? run_random(handle, plan) : run_ops(handle, plan);
  if (plan.json) {
    print_json(results, handle, plan);
  } else {
    print_table(results, handle, plan);
  }
  return report_verification(results, handle) ? kExitOk : kExitFailure;
}

}  // namespace nvio_cli
