// Internals shared by the translation units of `nvio bench` (tools/nvio/bench*.cpp): the run's
// plan (parsed and validated before any file is touched), its results, timing, and the functions
// each part gives the others. bench_args.cpp parses the flags into a Plan; bench.cpp runs the
// sequential operations and the command itself; bench_random.cpp the --pattern random loops;
// bench_output.cpp prints the table or the JSON. Not part of nvio's API.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/handle.hpp"
#include "nvio/options.hpp"
#include "nvio/system.hpp"
#include "nvio/tune.hpp"
#include "procs.hpp"

namespace nvio_cli::bench {

// The most operations a --pattern random loop with --duration records per second of it: the
// latency array is allocated before the timed loop, so it needs a bound.
constexpr double kMaxOpsPerSecond = 2e6;

using Clock = std::chrono::steady_clock;

enum class Op { Read, Write, Both };
enum class Pattern { Sequential, Random };

// The most operations one random loop may record (1 GiB of latencies).
constexpr std::uint64_t kMaxOpsPerLoop = std::uint64_t{1} << 28;

// --pattern random: what the timed loops do.
struct RandomPlan {
  std::uint64_t file_size = 0;
  std::optional<std::uint64_t> ops;  // per loop
  std::optional<double> duration;    // seconds per loop
  std::uint64_t capacity = 0;        // the most operations a loop records
  unsigned outstanding = 0;
  bool outstanding_given = false;  // else queue_depth x parallelism
  unsigned batch = 1;
};

// Everything a run needs, parsed and validated before any file is touched.
struct Plan {
  // The file, or with several --dir the striped file's name in each of `stripe_dirs`.
  std::string path;
  std::vector<std::string> stripe_dirs;  // empty: one file
  std::size_t stripe_size = 0;
  bool scratch = false;  // path is our own nvio-bench-<pid>.dat under --dir
  // The size of a --file that existed before the run: the user's data, not ours.
  std::optional<std::uint64_t> existing_size;
  std::size_t size = 0;
  Pattern pattern = Pattern::Sequential;
  std::uint64_t offset = 0;  // sequential: where the transfer starts
  RandomPlan random;
  Op op = Op::Both;
  unsigned loops = 0;
  std::uint64_t seed = 0;
  bool verify = false;
  bool sync = false;  // sequential writes: durability Data (fdatasync inside the timed call)
  bool keep = false;
  bool json = false;
  enum class Memory { Host, Device, H2dOnly } memory = Memory::Host;
  int device = 0;
  nvio::EffectiveOptions options;
  // A striped run: each drive's options, the flags over that drive's saved profile.
  std::vector<nvio::EffectiveOptions> drive_options;
  // In a process of a --procs run: the barrier every timed loop starts behind.
  std::optional<LoopGate> gate;

  // The end of the bytes of the file the run reads or writes.
  std::uint64_t end() const {
    return pattern == Pattern::Random ? random.file_size : offset + size;
  }
};

inline const char* memory_name(const Plan& plan) {
  switch (plan.memory) {
    case Plan::Memory::Host: return "host";
    case Plan::Memory::Device: return "device";
    case Plan::Memory::H2dOnly: return "h2d-only";
  }
  return "?";
}

struct Sample {
  double seconds = 0;
  double cpu_seconds = 0;
  // When the timed part began and ended: steady_clock is CLOCK_MONOTONIC, one clock for every
  // process, so that a --procs run can take the span from the earliest start to the latest end.
  Clock::time_point start{};
  Clock::time_point end{};
  // Random loops only: operations completed, and latency percentiles in microseconds.
  std::uint64_t ops = 0;
  double p50_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  // A striped run: each drive's seconds until its last byte, in directory order.
  std::vector<double> drive_seconds;
};

struct OpResult {
  OpResult(const char* op_name, std::size_t op_bytes, std::vector<std::uint64_t> drives = {})
      : op(op_name), bytes(op_bytes), drive_bytes(std::move(drives)) {}
  const char* op = "";
  std::size_t bytes = 0;
  std::vector<Sample> samples;
  std::optional<bool> verified;             // nullopt: not verified
  std::optional<std::uint64_t> bad_offset;  // first mismatching file offset when verify failed
  std::vector<std::uint64_t> drive_bytes;   // a striped run: each drive's share of `bytes`
  // The handle's counters over the timed loops only (after - before; a striped run: all its
  // drives' handles); nullopt without a handle (--h2d-only).
  std::optional<nvio::HandleStats> stats;
};

// ---- progress (bench.cpp and bench_random.cpp)
// -----------------------------------------------------------------------------------

// A single "\r" status line on stderr, shown only on a terminal and only once the run has taken
// more than kDelay (short runs stay quiet). A thread redraws it, since the timed calls block.
class Progress {
 public:
  explicit Progress(bool enabled) : start_(Clock::now()) {
    if (enabled) thread_ = std::thread([this] { draw_loop(); });
  }
  ~Progress() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (shown_) std::fputs("\r\x1b[K", stderr);  // clear the line for what follows
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set(std::string status) {
    std::lock_guard lock(mutex_);
    status_ = std::move(status);
  }

 private:
  static constexpr auto kDelay = std::chrono::seconds(2);
  static constexpr auto kPeriod = std::chrono::milliseconds(250);

  void draw_loop() {
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, kPeriod, [this] { return stop_; })) {
      auto elapsed = Clock::now() - start_;
      if (elapsed < kDelay || status_.empty()) continue;
      double seconds = std::chrono::duration<double>(elapsed).count();
      std::fprintf(stderr, "\rnvio bench: %s (%.1f s)\x1b[K", status_.c_str(), seconds);
      std::fflush(stderr);
      shown_ = true;
    }
  }

  Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string status_;
  bool stop_ = false;
  bool shown_ = false;
  std::thread thread_;
};

// ---- timing -------------------------------------------------------------------------------------

template <typename Fn>
Sample time_once(Fn&& fn) {
  double cpu0 = nvio::process_cpu_seconds();
  auto t0 = Clock::now();
  fn();
  auto t1 = Clock::now();
  Sample s;
  s.seconds = std::chrono::duration<double>(t1 - t0).count();
  s.cpu_seconds = nvio::process_cpu_seconds() - cpu0;
  s.start = t0;
  s.end = t1;
  return s;
}

using nvio::median;

// Drops `path`'s pages from the page cache, so that a buffered read really reads the device. Best
// effort: a failure only makes the read look faster, and the read itself reports real errors
// (missing file, permissions).
inline void evict_best_effort(const std::string& path) {
  try {
    nvio::evict_page_cache(path);
  } catch (const nvio::Error&) {
  }
}

inline double median_seconds(const OpResult& r) {
  std::vector<double> v;
  for (const Sample& s : r.samples) v.push_back(s.seconds);
  return median(v);
}

// The bytes one loop moved: the buffer for a sequential loop, its operations' blocks for a
// random one (whose loops may differ in length when --duration ends them).
inline double loop_bytes(const OpResult& r, const Sample& s) {
  return static_cast<double>(r.bytes) * static_cast<double>(s.ops != 0 ? s.ops : 1);
}

// The median over loops of a figure of each loop.
template <typename Fn>
double median_of(const OpResult& r, Fn&& figure) {
  std::vector<double> v;
  for (const Sample& s : r.samples) v.push_back(figure(s));
  return median(v);
}

inline double median_cpu_s_per_gb(const OpResult& r) {
  return median_of(r, [&](const Sample& s) { return s.cpu_seconds / (loop_bytes(r, s) / 1e9); });
}

// ---- what each part gives the others
// -------------------------------------------------------------

// bench_args.cpp: the flags as a validated plan; a UsageError or nvio::InvalidArgument otherwise.
Plan make_plan(const BenchArgs& args);

// bench.cpp: the size of the file at `path`, nullopt when it does not exist.
std::optional<std::uint64_t> file_size(const std::string& path);

// bench_random.cpp: refuses buffers beyond the memory there is (before any file is made), and runs
// the random loops.
void check_random_memory(const Plan& plan);
std::vector<OpResult> run_random(nvio::Handle& handle, const Plan& plan);

// bench_output.cpp: the results as a table or JSON on stdout; false (after saying so on stderr)
// when a verification failed.
void print_json(const std::vector<OpResult>& results, const nvio::Handle& handle, const Plan& plan);
void print_table(const std::vector<OpResult>& results, const nvio::Handle& handle,
                 const Plan& plan);
bool report_verification(const std::vector<OpResult>& results, const nvio::Handle& handle);

}  // namespace nvio_cli::bench
