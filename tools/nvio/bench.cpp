// `nvio bench`: times handle.write / handle.read of one buffer to one file and reports GB/s.
//
// Each loop moves the whole buffer once. Wall time comes from steady_clock; CPU time from
// getrusage(RUSAGE_SELF), which includes the library's worker threads (they live in this process).
// Reported figures are medians over loops, so one slow loop (a flush, a noisy neighbour) does not
// skew the result. The JSON's per-result "stats" are the handle's counters (Handle::stats()) over
// the timed loops only: the difference of snapshots taken around them, leaving out the untimed
// operations (laying out the file, verifying a write) that use the same handle.
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

#include "cli.hpp"
#include "core/median.hpp"
#include "core/posix.hpp"
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

namespace {

// The most operations a --pattern random loop with --duration records per second of it: the
// latency array is allocated before the timed loop, so it needs a bound.
constexpr double kMaxOpsPerSecond = 2e6;

// The flag of an option: its name with dashes ("--queue-depth"); intra_op_parallelism is also
// --parallelism, the flag's established shorter name, which messages use.
std::string flag_names(const nvio::OptionSpec& spec) {
  std::string dashed = spec.name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  if (std::string_view(spec.name) == "intra_op_parallelism") return "--parallelism,--" + dashed;
  return "--" + dashed;
}

// One flag per row of the option table (two for a boolean: --NAME sets it, --no-NAME clears it).
void add_option_flags(CLI::App& app, std::map<std::string, BenchArgs::OptionFlag>& options) {
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    const std::string names = flag_names(spec);
    const std::string flag = names.substr(0, names.find(','));
    const std::string name = spec.name;
    const std::string env = fmt::format(" [env {}]", spec.environment);
    if (spec.type == nvio::OptionType::Boolean) {
      CLI::Option* on = app.add_flag_callback(
          names,
          [&options, name, flag] {
            options[name] = {flag, "true"};
          },
          spec.description + env);
      const std::string off = "--no-" + flag.substr(2);
      CLI::Option* no = app.add_flag_callback(
          off,
          [&options, name, off] {
            options[name] = {off, "false"};
          },
          fmt::format("Do not: {}{}", spec.description, env));
      // Both given: CLI11 runs the callbacks in the order they were defined, not as typed, so
      // --no-NAME would win whichever came last. Refused instead.
      on->excludes(no);
      continue;
    }
    const bool choice = spec.type == nvio::OptionType::Choice;
    app.add_option_function<std::string>(
           names,
           [&options, name, flag](const std::string& text) {
             options[name] = {flag, text};
           },
           choice ? fmt::format("{}: {}{}", spec.description, spec.accepted, env)
                  : spec.description + env)
        ->type_name(choice                                   ? "MODE"
                    : std::string_view(spec.unit) == "bytes" ? "BYTES"
                                                             : "N");
  }
}

}  // namespace

void add_bench_options(CLI::App& app, BenchArgs& args) {
  app.add_option("--dir", args.dirs,
                 "Directory for the scratch file nvio-bench-<pid>.dat (made if missing). Repeat "
                 "it for several drives: the file is striped over them (--stripe-size), each "
                 "drive with its own handle and saved profile, and each drive's GB/s is shown")
      ->type_name("DIR");
  app.add_option("--stripe-size", args.stripe_size,
                 "With several --dir: bytes per stripe, a multiple of 4K (default 1M)")
      ->type_name("BYTES");
  app.add_option("--file", args.file,
                 "Use exactly this regular file instead of a scratch file under --dir. A file the "
                 "run creates is removed unless --keep. A file that existed before the run is "
                 "never removed and is written only when --op write or --op both is given "
                 "explicitly (that overwrites its first --size bytes); --op read only reads it and "
                 "refuses a --size larger than the file")
      ->type_name("PATH");
  app.add_option("--size", args.size,
                 "Bytes per operation; K/M/G suffixes are powers of 1024 (default 1G; with "
                 "--pattern random the block size of each operation, a multiple of 512, default "
                 "4K)")
      ->type_name("BYTES");
  app.add_option("--op", args.op, "read, write or both (write first); default both")
      ->type_name("OP");
  app.add_option("--pattern", args.pattern,
                 "sequential: one transfer of --size bytes per loop; random: --size blocks at "
                 "random offsets (aligned to --size, uniform over --file-size, chosen from "
                 "--seed) with --outstanding operations in flight, reporting IOPS and latency "
                 "percentiles")
      ->type_name("MODE")
      ->capture_default_str();
  // The flags whose value stays as typed until make_plan parses it.
  const struct {
    const char* flag;
    std::optional<std::string> BenchArgs::*value;
    const char* type;
    std::string help;
  } optional_flags[] = {
      {"--offset", &BenchArgs::offset, "BYTES",
       "Sequential: the file offset the transfer starts at (default 0); at an unaligned one (e.g. "
       "4103) the same page-aligned buffer is no longer aligned with the file: writes go through "
       "bounce buffers, reads land shifted in the buffer and move into place"},
      {"--file-size", &BenchArgs::file_size, "BYTES",
       "Random: the bytes of the file the blocks are drawn from (default 1G); a file shorter "
       "than this is first filled with the pattern (untimed)"},
      {"--ops", &BenchArgs::ops, "N",
       "Random: operations per loop (with --duration too, whichever ends first)"},
      {"--duration", &BenchArgs::duration, "S",
       fmt::format("Random: seconds per loop (default 2 when --ops is not given). A loop records "
                   "at most {:.0f} operations per second of --duration and ends there",
                   kMaxOpsPerSecond)},
      {"--outstanding", &BenchArgs::outstanding, "N",
       "Random: operations kept in flight (default queue_depth x parallelism); a multiple of "
       "--batch"},
      {"--batch", &BenchArgs::batch, "B",
       "Random: operations per submission (default 1: one submit_read/submit_write by "
       "descriptor each; B > 1: one submit_read_batch/submit_write_batch of B extents, "
       "resubmitted as soon as it completes, and every extent gets its batch's latency). "
       "Latency is from submission to the completion being seen (Handle::wait_some collects "
       "whichever finished)"},
  };
  for (const auto& f : optional_flags) {
    app.add_option(f.flag, args.*f.value, f.help)->type_name(f.type);
  }
  app.add_option("--loops", args.loops, "Timed loops per operation")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--seed", args.seed,
                 "Seed of the data pattern (default: a new one from time and pid, so that no file "
                 "left by another run can pass --verify)")
      ->type_name("N");
  add_option_flags(app, args.options);
  app.add_flag("--verify", args.verify,
               "Check every byte read back against the pattern; exit 1 naming the first bad "
               "offset on a mismatch. Reading an existing --file needs the --seed it was written "
               "with (--op write --keep --seed N). Random: every block is checked (and every "
               "written block filled) inside the timed loop, so timings with --verify are not "
               "comparable with those without; without it, random writes store the buffer as "
               "it is");
  app.add_flag("--sync", args.sync,
               "Sequential: each timed write ends with fdatasync of the file (durable, as a "
               "checkpoint must be; fio's --end_fsync=1)");
  app.add_flag("--keep", args.keep, "Keep the file the run wrote (default: remove it)");
  app.add_flag("--json", args.json,
               "Print one JSON object instead of a table; each result has a \"stats\" object, "
               "the handle's counters over its timed loops (see README)");
  app.add_flag("--gpu", args.gpu,
               "Move data between GPU memory (cuMemAlloc) and the file, through the pipelined "
               "host bounce path (gpu_direct=off)");
  app.add_flag("--gds", args.gds, "With --gpu: through cuFile / GPUDirect Storage (gpu_direct=on)");
  app.add_flag("--h2d-only", args.h2d_only,
               "With --gpu: time only copies between locked host memory and the GPU (no file), "
               "the PCIe bound the device path is measured against");
  add_device_option(app, args.device, args.device_given);
  add_procs_options(app, args);
}

namespace {

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

const char* memory_name(const Plan& plan) {
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

// ---- argument parsing -------------------------------------------------------------------------

Op parse_op(const std::string& text) {
  if (text == "read") return Op::Read;
  if (text == "write") return Op::Write;
  if (text == "both") return Op::Both;
  throw UsageError("--op: expected read, write or both, got '" + text + "'");
}

Pattern parse_pattern(const std::string& text) {
  if (text == "sequential") return Pattern::Sequential;
  if (text == "random") return Pattern::Random;
  throw UsageError("--pattern: expected sequential or random, got '" + text + "'");
}

// A positive, finite number of seconds ("2", "0.5").
double parse_seconds(const std::string& text, const char* flag) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(value) ||
      value <= 0) {
    throw UsageError(
        fmt::format("{}: expected a positive number of seconds, got '{}'", flag, text));
  }
  return value;
}

std::uint64_t parse_seed(const std::string& text) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw UsageError("--seed: expected an unsigned 64-bit integer, got '" + text + "'");
  }
  return value;
}

// Varies per run so that a file left over from another run never passes --verify by accident.
std::uint64_t default_seed() {
  std::uint64_t x = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
                    (static_cast<std::uint64_t>(::getpid()) << 32);
  x += 0x9e3779b97f4a7c15ULL;  // splitmix64 finaliser: spreads nearby clock values apart
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A count that must fit in `unsigned`: rejected rather than wrapped (2^32 + 1 must not become 1).
unsigned parse_unsigned(const std::string& text, const char* flag) {
  std::size_t value = nvio::parse_count(text, flag);
  if (value > std::numeric_limits<unsigned>::max()) {
    throw UsageError(fmt::format("{}: {} is out of range", flag, text));
  }
  return static_cast<unsigned>(value);
}

// Only flags given on the command line become overrides; the rest come from NVIO_* or defaults.
// The first bad value is kept in `bad`, naming the option and, after it, the flag it came from: it
// is raised once the environment and the configuration file have been checked, whose mistakes are
// reported first (a bad variable must be heard about whatever the flags say).
nvio::OptionOverrides build_overrides(const BenchArgs& args,
                                      std::optional<nvio::InvalidArgument>& bad) {
  nvio::OptionOverrides o;
  for (const auto& [name, given] : args.options) {
    try {
      o.set_text(name, given.text);
    } catch (const nvio::InvalidArgument& e) {
      if (!bad) bad.emplace(fmt::format("{} (from {})", e.what(), given.flag), e.option());
    }
  }
  return o;
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// What a run may do to a --file that already exists: it is the user's data, so it is written only
// on an explicit --op write/both, and a read-only run must find all --size bytes already there
// rather than have them written. Checked before any file is touched.
void check_existing_file(const BenchArgs& args, Plan& plan) {
  struct stat st {};
  if (::stat(plan.path.c_str(), &st) != 0) {
    if (errno != ENOENT) nvio::throw_io_error(nvio::IoOp::Stat, plan.path, 0, 0, errno);
    // A link to a missing file: the run would create its target and then remove the link, the
    // user's, instead of the file it made.
    if (::lstat(plan.path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      throw UsageError(fmt::format(
          "--file {} is a symbolic link to a file that does not exist: give the path of the file "
          "itself",
          plan.path));
    }
    return;  // the run creates it (and removes it unless --keep)
  }
  if (!S_ISREG(st.st_mode)) {
    throw UsageError(fmt::format(
        "--file {} is {}: nvio bench reads and writes regular files only{}", plan.path,
        kind_of(st.st_mode), S_ISDIR(st.st_mode) ? " (--dir DIR puts a scratch file in DIR)" : ""));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  plan.existing_size = size;
  if (!args.op) {
    throw UsageError(fmt::format(
        "--file {} exists ({} bytes) and the default --op both would overwrite it: give --op read "
        "to only read it, or --op write or --op both to overwrite it",
        plan.path, size));
  }
  if (plan.op != Op::Read) return;  // an explicit instruction to write it
  if (size < plan.end()) {
    const std::string wanted =
        plan.pattern == Pattern::Random ? fmt::format("--file-size {}", plan.end())
        : plan.offset != 0 ? fmt::format("--offset {} plus --size {}", plan.offset, plan.size)
                           : fmt::format("--size {}", plan.size);
    const std::string fix = plan.pattern == Pattern::Random ? "--file-size"
                            : plan.offset != 0              ? "--offset plus --size"
                                                            : "--size";
    throw UsageError(fmt::format(
        "{} is larger than --file {} ({} bytes): a read-only run never writes an existing file; "
        "give {} {} or less",
        wanted, plan.path, size, fix, size));
  }
  if (plan.verify && !args.seed) {
    throw UsageError(fmt::format(
        "--verify of the existing --file {} needs --seed, the seed it was written with (nvio "
        "bench --op write --keep --seed N); a file nvio did not write holds no pattern to check",
        plan.path));
  }
}

// The flags of one pattern are refused with the other, rather than silently ignored; --offset
// and the random flags are parsed here, the random ones' defaults in plan_random.
void check_pattern_flags(const BenchArgs& args, Plan& plan) {
  if (plan.pattern == Pattern::Sequential) {
    const std::pair<const char*, const std::optional<std::string>*> random_only[] = {
        {"--file-size", &args.file_size},
        {"--ops", &args.ops},
        {"--duration", &args.duration},
        {"--outstanding", &args.outstanding},
        {"--batch", &args.batch}};
    for (const auto& [flag, value] : random_only) {
      if (*value) throw UsageError(fmt::format("{} applies to --pattern random only", flag));
    }
    if (args.offset) plan.offset = nvio::parse_size(args.offset.value(), "--offset");
    plan.sync = args.sync;
    return;
  }
  if (args.sync) {
    throw UsageError("--sync applies to --pattern sequential only (a random write is one block)");
  }
  if (args.offset) {
    throw UsageError(
        "--offset applies to --pattern sequential only (random offsets are aligned "
        "to --size)");
  }
  if (args.gpu) throw UsageError("--pattern random moves host memory only (no --gpu)");
  if (plan.size < 512 || plan.size % 512 != 0) {
    throw UsageError(fmt::format(
        "--size: a --pattern random block must be a multiple of 512 bytes (4K and up for direct "
        "I/O on most drives), got {}",
        plan.size));
  }
}

// The random plan's numbers; the default --outstanding needs the resolved options.
void plan_random(const BenchArgs& args, Plan& plan) {
  RandomPlan& r = plan.random;
  r.file_size = nvio::parse_size(args.file_size.value_or("1G"), "--file-size");
  if (r.file_size < plan.size) {
    throw UsageError(
        fmt::format("--file-size {} is smaller than --size {}: the file must hold at "
                    "least one block",
                    r.file_size, plan.size));
  }
  if (args.ops) {
    r.ops = nvio::parse_count(*args.ops, "--ops");
    if (*r.ops == 0) throw UsageError("--ops: must be at least 1");
  }
  if (args.duration) r.duration = parse_seconds(*args.duration, "--duration");
  if (!r.ops && !r.duration) r.duration = 2.0;
  r.capacity = r.ops ? *r.ops : kMaxOpsPerLoop;
  if (r.duration) {
    r.capacity = std::min<std::uint64_t>(
        r.capacity, static_cast<std::uint64_t>(std::ceil(*r.duration * kMaxOpsPerSecond)));
  }
  if (r.capacity > kMaxOpsPerLoop) {
    throw UsageError(fmt::format("{}: at most {} operations per loop",
                                 r.ops ? "--ops" : "--duration", kMaxOpsPerLoop));
  }
  const nvio::Options& o = plan.options.values;
  r.outstanding = args.outstanding ? parse_unsigned(*args.outstanding, "--outstanding")
                                   : o.queue_depth * o.intra_op_parallelism;
  r.outstanding_given = args.outstanding.has_value();
  r.batch = args.batch ? parse_unsigned(*args.batch, "--batch") : 1;
  if (r.outstanding == 0) throw UsageError("--outstanding: must be at least 1");
  if (r.batch == 0) throw UsageError("--batch: must be at least 1");
  if (r.outstanding % r.batch != 0) {
    throw UsageError(
        fmt::format("--outstanding {} is not a multiple of --batch {}", r.outstanding, r.batch));
  }
}

}  // namespace

std::string scratch_name(long pid) { return fmt::format("nvio-bench-{}.dat", pid); }

std::string scratch_path(const std::string& dir, long pid) {
  return (std::filesystem::path(dir) / scratch_name(pid)).string();
}

namespace {

Plan make_plan(const BenchArgs& args) {
  if ((args.gds || args.h2d_only) && !args.gpu) throw UsageError("--gds and --h2d-only need --gpu");
  if (args.gds && args.h2d_only) throw UsageError("--gds and --h2d-only exclude each other");
  if (args.device_given && !args.gpu) throw UsageError("--device applies with --gpu only");
  for (const std::string& d : args.dirs) {
    if (d.empty()) throw UsageError("--dir: the directory name is empty");
  }
  const bool needs_file = !args.h2d_only;
  if (needs_file && args.dirs.empty() && !args.file) {
    throw UsageError("bench: --dir DIR or --file PATH is required");
  }
  const bool striped = args.dirs.size() > 1;
  if (args.file && !args.dirs.empty())
    throw UsageError("bench: --file and --dir exclude each other");
  if (args.stripe_size && !striped) throw UsageError("--stripe-size needs several --dir");
  Plan plan;
  if (args.gpu) {
    plan.memory = args.h2d_only ? Plan::Memory::H2dOnly : Plan::Memory::Device;
    plan.device = parse_device(args.device);
  }
  plan.pattern = parse_pattern(args.pattern);
  const bool random = plan.pattern == Pattern::Random;
  plan.size = nvio::parse_size(args.size.value_or(random ? "4K" : "1G"), "--size");
  if (plan.size == 0) throw UsageError("--size: must be at least 1 byte");
  check_pattern_flags(args, plan);
  plan.op = parse_op(args.op.value_or("both"));
  if (args.sync && plan.op == Op::Read)
    throw UsageError("--sync applies to writes: --op read writes nothing");
  plan.loops = parse_unsigned(args.loops, "--loops");
  if (plan.loops == 0) throw UsageError("--loops: must be at least 1");
  plan.seed = args.seed ? parse_seed(*args.seed) : default_seed();
  plan.verify = args.verify;
  plan.keep = args.keep;
  plan.json = args.json;
  if (args.role) {
    plan.gate.emplace(args.role->ready_fd, args.role->go_fd);
    plan.json = true;  // the parent reads the result from the process's stdout
  }
  std::optional<nvio::InvalidArgument> bad_flag;
  nvio::OptionOverrides overrides = build_overrides(args, bad_flag);
  if (args.gds && overrides.gpu_direct)
    throw UsageError("--gds and --gpu-direct exclude each other");
  if (args.gpu && !overrides.gpu_direct) {
    overrides.gpu_direct = args.gds ? nvio::GpuDirect::On : nvio::GpuDirect::Off;
  }
  // The saved configuration's profile is the one of the drive the file is on.
  std::string config_dir = ".";
  if (args.file) {
    const std::filesystem::path parent = std::filesystem::path(*args.file).parent_path();
    if (!parent.empty()) config_dir = parent.string();
  } else if (!args.dirs.empty()) {
    config_dir = args.dirs.front();
  }
  plan.options = nvio::resolve_options(overrides, {}, config_dir);
  if (bad_flag) throw *bad_flag;
  if (random) plan_random(args, plan);
  if (striped) {
    if (random) throw UsageError("--pattern random takes one --dir");
    if (args.h2d_only) throw UsageError("--h2d-only touches no file: give no --dir");
    plan.stripe_dirs = args.dirs;
    plan.stripe_size = nvio::parse_size(args.stripe_size.value_or("1M"), "--stripe-size");
    nvio::StripeLayout{plan.stripe_dirs, plan.stripe_size}.validate();
    for (const std::string& d : plan.stripe_dirs) {
      plan.drive_options.push_back(nvio::resolve_options(overrides, {}, d));
    }
  }
  if (args.gpu) {
    // Checked after the options, so that a bad flag is reported first; exit 2 like a bad flag.
    require_gpu(plan.device);
  }
  if (!needs_file) return plan;
  if (args.file) {
    plan.path = *args.file;
    check_existing_file(args, plan);
  } else {
    plan.path = striped ? scratch_name(::getpid()) : scratch_path(args.dirs.front(), ::getpid());
    plan.scratch = true;
  }
  return plan;
}

// ---- files --------------------------------------------------------------------------------------

std::optional<std::uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_size);
}

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

// ---- progress -----------------------------------------------------------------------------------

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
  double cpu0 = nvio::detail::process_cpu_seconds();
  auto t0 = Clock::now();
  fn();
  auto t1 = Clock::now();
  Sample s;
  s.seconds = std::chrono::duration<double>(t1 - t0).count();
  s.cpu_seconds = nvio::detail::process_cpu_seconds() - cpu0;
  s.start = t0;
  s.end = t1;
  return s;
}

using nvio::detail::median;

double median_seconds(const OpResult& r) {
  std::vector<double> v;
  for (const Sample& s : r.samples) v.push_back(s.seconds);
  return median(v);
}

// The bytes one loop moved: the buffer for a sequential loop, its operations' blocks for a
// random one (whose loops may differ in length when --duration ends them).
double loop_bytes(const OpResult& r, const Sample& s) {
  return static_cast<double>(r.bytes) * static_cast<double>(s.ops != 0 ? s.ops : 1);
}

// The median over loops of a figure of each loop.
template <typename Fn>
double median_of(const OpResult& r, Fn&& figure) {
  std::vector<double> v;
  for (const Sample& s : r.samples) v.push_back(figure(s));
  return median(v);
}

double median_cpu_s_per_gb(const OpResult& r) {
  return median_of(r, [&](const Sample& s) { return s.cpu_seconds / (loop_bytes(r, s) / 1e9); });
}

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
  // So that a buffered read really reads the device. Best effort: a failure only makes the read
  // look faster, and the read itself reports real errors (missing file, permissions).
  void evict() const {
    for (const std::string& p : paths(plan_)) nvio::detail::evict_page_cache(p);
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

// ---- random I/O ---------------------------------------------------------------------------------

// Uniform block-aligned offsets below file_size, like fio's randread with norandommap: a
// splitmix64 stream, scaled to the block count by a 128-bit multiply (no modulo bias worth
// naming). Not thread-safe; one per loop.
class BlockPicker {
 public:
  BlockPicker(std::uint64_t seed, std::uint64_t file_size, std::size_t block)
      : state_(seed), blocks_(file_size / block), block_(block) {}
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const auto index =
        static_cast<std::uint64_t>((static_cast<unsigned __int128>(z) * blocks_) >> 64);
    return index * block_;
  }

 private:
  std::uint64_t state_;
  std::uint64_t blocks_;
  std::size_t block_;
};

// The submissions in flight, and their completions collected in bulk as they finish. Owns no
// buffers; not thread-safe.
class InFlight {
 public:
  explicit InFlight(std::size_t capacity) : completions_(capacity) {
    entries_.reserve(capacity);
    groups_.reserve(capacity);
  }
  void push(std::size_t group, nvio::Ticket ticket) { entries_.push_back({group, ticket}); }
  bool empty() const { return entries_.empty(); }
  // Waits until at least one submission has completed and returns the groups of all that have,
  // in the order they finished (Handle::wait_some); throws the first failure among them.
  const std::vector<std::size_t>& wait_some(nvio::Handle& handle) {
    groups_.clear();
    const std::size_t n = handle.wait_some(completions_, 1);
    std::exception_ptr first;
    for (std::size_t i = 0; i < n; ++i) {
      const nvio::Completion& c = completions_[i];
      // At most `capacity` entries: a linear search costs less than a hash map's allocations.
      auto it = std::find_if(entries_.begin(), entries_.end(),
                             [&](const Entry& e) { return e.ticket == c.ticket; });
      groups_.push_back(it->group);
      *it = entries_.back();
      entries_.pop_back();
      if (c.error && !first) first = c.error;
    }
    if (first) std::rethrow_exception(first);
    return groups_;
  }

 private:
  struct Entry {
    std::size_t group = 0;
    nvio::Ticket ticket = 0;
  };
  std::vector<Entry> entries_;
  std::vector<nvio::Completion> completions_;
  std::vector<std::size_t> groups_;
};

// Waits for every operation of the handle on every way out of a random loop (an I/O error raised
// by one wait leaves the others in flight), so that none outlives the buffers and the descriptor
// declared before it. Errors here are dropped: the first one is already on its way out.
class DrainOnExit {
 public:
  explicit DrainOnExit(nvio::Handle& handle) : handle_(handle) {}
  ~DrainOnExit() {
    try {
      handle_.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): see the class comment
    }
  }
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;

 private:
  nvio::Handle& handle_;
};

// The file opened once for a random run, O_DIRECT where the options allow and the file system
// supports it, and handed to the handle by descriptor; read-only for a read-only run of an existing
// file (which may not be writable).
nvio::detail::FileDescriptor open_for_random(const Plan& plan) {
  const int access = plan.existing_size && plan.op == Op::Read ? O_RDONLY : O_RDWR | O_CREAT;
  if (plan.options.values.direct != nvio::DirectIo::Off) {
    const int fd = nvio::detail::open_file(plan.path, access | O_DIRECT);
    if (fd >= 0) return nvio::detail::FileDescriptor(fd);
    if (fd != -EINVAL || plan.options.values.direct == nvio::DirectIo::On) {
      nvio::throw_io_error(nvio::IoOp::Open, plan.path, 0, 0, -fd);
    }
  }
  const int fd = nvio::detail::open_file(plan.path, access);
  if (fd < 0) nvio::throw_io_error(nvio::IoOp::Open, plan.path, 0, 0, -fd);
  return nvio::detail::FileDescriptor(fd);
}

// Untimed chunks of the pattern: written over, or read back and checked against, [0, end).
constexpr std::size_t kLayoutChunk = std::size_t{8} << 20;

void lay_out(nvio::Handle& handle, int fd, const Plan& plan) {
  nvio::AlignedBuffer chunk(std::min<std::uint64_t>(kLayoutChunk, plan.end()));
  for (std::uint64_t at = 0; at < plan.end(); at += chunk.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), plan.end() - at));
    nvio::pattern::fill(chunk.data(), n, at, plan.seed);
    handle.write(chunk.data(), n, fd, at, {.memory = nvio::MemoryKind::Host});
  }
}

void check_file(nvio::Handle& handle, int fd, const Plan& plan, OpResult& result) {
  nvio::AlignedBuffer chunk(std::min<std::uint64_t>(kLayoutChunk, plan.end()));
  for (std::uint64_t at = 0; at < plan.end(); at += chunk.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), plan.end() - at));
    handle.read(chunk.data(), n, fd, at, {.memory = nvio::MemoryKind::Host});
    result.bad_offset = nvio::pattern::first_mismatch(chunk.data(), n, at, plan.seed);
    if (result.bad_offset) break;
  }
  result.verified = !result.bad_offset;
}

// The p-quantile (nearest rank) of `v`, in microseconds; reorders v.
double percentile_us(std::vector<std::uint64_t>& v, std::size_t n, double p) {
  if (n == 0) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(n)));
  rank = std::clamp<std::size_t>(rank, 1, n) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank),
                   v.begin() + static_cast<std::ptrdiff_t>(n));
  return static_cast<double>(v[rank]) / 1e3;
}

// A random run keeps one --size buffer per operation in flight: --outstanding 8192 of 4 MiB is
// 32 GiB. The messages about that memory name the flags that make it.
std::string random_memory_text(const Plan& plan) {
  const RandomPlan& r = plan.random;
  return fmt::format(
      "--pattern random keeps one --size buffer per operation in flight: --outstanding {}{} x "
      "--size {} = {:.1f} GiB",
      r.outstanding, r.outstanding_given ? "" : " (default: queue_depth x parallelism)",
      human_bytes(plan.size),
      static_cast<double>(r.outstanding) * static_cast<double>(plan.size) / (1ULL << 30));
}

// More than the memory there is is refused before anything is written, with how many operations
// fit, rather than as a bare failed mmap (or a run that swaps).
void check_random_memory(const Plan& plan) {
  const RandomPlan& r = plan.random;
  const std::optional<MemoryRoom> room = memory_room();
  if (!room || plan.size <= room->bytes / r.outstanding) return;
  // Whole batches: --outstanding must stay a multiple of --batch.
  const std::uint64_t fit = room->bytes / plan.size / r.batch * r.batch;
  const std::string advice =
      fit == 0 ? fmt::format("not even {} operation{} of this --size fit{}; lower --size", r.batch,
                             r.batch == 1 ? "" : "s", r.batch == 1 ? "s" : "")
               : fmt::format(
                     "at most {} operations of this --size fit; lower --outstanding or "
                     "--size",
                     fit);
  throw nvio::MemoryError(
      fmt::format("{}, more than the {:.1f} GiB that fit ({}): {}", random_memory_text(plan),
                  static_cast<double>(room->bytes) / (1ULL << 30), room->source, advice),
      ENOMEM);
}

// The buffer slots; a refused allocation (the check above passed: overcommit, a limit it does not
// read) is still reported with the flags that asked for it.
nvio::AlignedBuffer random_slots(const Plan& plan) {
  try {
    return nvio::AlignedBuffer(std::size_t{plan.random.outstanding} * plan.size);
  } catch (const nvio::MemoryError& e) {
    throw nvio::MemoryError(fmt::format("{}: {}", random_memory_text(plan), e.what()),
                            e.error_code());
  }
}

// Everything a random loop uses, allocated before the timed part: one buffer slot of --size bytes
// per operation in flight, the extents of each group (a group is the `batch` operations submitted
// together), the offsets in flight (for --verify) and one latency per operation.
struct RandomState {
  RandomState(const Plan& plan, int fd)
      : slots(random_slots(plan)),
        groups(plan.random.outstanding / plan.random.batch),
        reads(plan.random.outstanding),
        writes(plan.random.outstanding),
        offsets(plan.random.outstanding),
        latency_ns(plan.random.capacity),
        inflight(plan.random.outstanding / plan.random.batch) {
    for (unsigned i = 0; i < plan.random.outstanding; ++i) {
      reads[i].buf = slot(i, plan);
      reads[i].length = plan.size;
      reads[i].fd = fd;
      writes[i].buf = slot(i, plan);
      writes[i].length = plan.size;
      writes[i].fd = fd;
    }
    // Without --verify a write stores what its slot holds: the pattern of offset 0 from here.
    for (unsigned i = 0; i < plan.random.outstanding; ++i) {
      nvio::pattern::fill(slot(i, plan), plan.size, 0, plan.seed);
    }
  }
  std::byte* slot(std::size_t i, const Plan& plan) const { return slots.bytes() + i * plan.size; }

  struct Group {
    std::size_t count = 0;  // operations in it this time (the last may be short of --batch)
    Clock::time_point submitted;
  };
  nvio::AlignedBuffer slots;
  std::vector<Group> groups;
  std::vector<nvio::ReadExtent> reads;
  std::vector<nvio::WriteExtent> writes;
  std::vector<std::uint64_t> offsets;
  // 64 bits: 32 saturated at 4.29 s, which a deep queue on a slow drive exceeds (and the
  // percentiles then printed 4294967.3 us as if measured).
  std::vector<std::uint64_t> latency_ns;
  InFlight inflight;
};

// One timed loop of random reads or writes (Op::Read or Op::Write); `loop` varies the offsets.
Sample random_loop(nvio::Handle& handle, int fd, RandomState& st, const Plan& plan, Op op,
                   unsigned loop, OpResult& result) {
  const RandomPlan& rp = plan.random;
  const bool read = op == Op::Read;
  BlockPicker picker(
      plan.seed ^ (std::uint64_t{loop} << 1 | (read ? 1 : 0)) * 0x2545f4914f6cdd1dULL, rp.file_size,
      plan.size);
  const nvio::ReadOptions read_options{.memory = nvio::MemoryKind::Host};
  const nvio::WriteOptions write_options{.memory = nvio::MemoryKind::Host};
  std::uint64_t submitted = 0;
  std::uint64_t done = 0;
  Clock::time_point deadline = Clock::time_point::max();

  // Submits group g's next operations, unless the loop is over; returns whether it did.
  auto submit = [&](std::size_t g, Clock::time_point now) {
    if (submitted >= rp.capacity || now >= deadline) return false;
    const std::size_t first = g * rp.batch;
    const auto count =
        static_cast<std::size_t>(std::min<std::uint64_t>(rp.batch, rp.capacity - submitted));
    for (std::size_t k = first; k < first + count; ++k) {
      const std::uint64_t offset = picker.next();
      st.offsets[k] = offset;
      st.reads[k].offset = offset;
      st.writes[k].offset = offset;
      if (!plan.verify) continue;
      if (read) {
        std::memset(st.slot(k, plan), 0xA5, plan.size);  // a read that moved nothing must fail
      } else {
        nvio::pattern::fill(st.slot(k, plan), plan.size, offset, plan.seed);
      }
    }
    st.groups[g] = {count, Clock::now()};
    nvio::Ticket ticket = 0;
    if (rp.batch == 1) {
      ticket = read ? handle.submit_read(st.reads[first].buf, plan.size, fd, st.offsets[first],
                                         read_options)
                    : handle.submit_write(st.writes[first].buf, plan.size, fd, st.offsets[first],
                                          write_options);
    } else if (read) {
      ticket = handle.submit_read_batch(std::span(st.reads).subspan(first, count), read_options);
    } else {
      ticket = handle.submit_write_batch(std::span(st.writes).subspan(first, count), write_options);
    }
    st.inflight.push(g, ticket);
    submitted += count;
    return true;
  };

  Sample sample;
  const double cpu0 = nvio::detail::process_cpu_seconds();
  const Clock::time_point t0 = Clock::now();
  if (rp.duration) {
    deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(*rp.duration));
  }
  Clock::time_point now = t0;
  std::size_t started = 0;
  while (started < st.groups.size() && submit(started, t0)) ++started;
  while (!st.inflight.empty()) {
    const std::vector<std::size_t>& finished = st.inflight.wait_some(handle);
    now = Clock::now();
    for (const std::size_t g : finished) {
      const RandomState::Group& group = st.groups[g];
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - group.submitted).count();
      const auto latency = static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 0));
      const std::size_t first = g * rp.batch;
      for (std::size_t k = first; k < first + group.count; ++k) {
        st.latency_ns[done++] = latency;
        if (plan.verify && read && result.verified != false) {
          result.bad_offset =
              nvio::pattern::first_mismatch(st.slot(k, plan), plan.size, st.offsets[k], plan.seed);
          if (result.bad_offset) result.verified = false;
        }
      }
      submit(g, now);
    }
  }
  sample.seconds = std::chrono::duration<double>(now - t0).count();
  sample.start = t0;
  sample.end = now;
  sample.cpu_seconds = nvio::detail::process_cpu_seconds() - cpu0;
  sample.ops = done;
  sample.p50_us = percentile_us(st.latency_ns, done, 0.50);
  sample.p99_us = percentile_us(st.latency_ns, done, 0.99);
  sample.p999_us = percentile_us(st.latency_ns, done, 0.999);
  return sample;
}

OpResult random_op(nvio::Handle& handle, int fd, RandomState& st, const Plan& plan, Op op,
                   Progress& progress) {
  const bool read = op == Op::Read;
  OpResult result(read ? "read" : "write", plan.size);
  const nvio::HandleStats before = handle.stats();
  for (unsigned i = 0; i < plan.loops; ++i) {
    progress.set(fmt::format("random {} loop {}/{}", result.op, i + 1, plan.loops));
    // So that buffered reads (direct off) really read the device; best effort, as for sequential.
    if (read) nvio::detail::evict_page_cache(plan.path);
    if (plan.gate) plan.gate->wait();
    result.samples.push_back(random_loop(handle, fd, st, plan, op, i, result));
  }
  result.stats = handle.stats() - before;
  if (plan.verify && read && result.verified != false) result.verified = true;
  return result;
}

// The random counterpart of run_ops: the file is opened once and laid out with the pattern when it
// is shorter than --file-size (and, for --verify of writes, always, so that every block read back
// holds the pattern); a write-only --verify reads the whole file back afterwards (untimed).
std::vector<OpResult> run_random(nvio::Handle& handle, const Plan& plan) {
  const nvio::detail::FileDescriptor file = open_for_random(plan);
  RandomState state(plan, file.get());
  const DrainOnExit drain(handle);
  Progress progress(::isatty(STDERR_FILENO) == 1);
  const auto size = file_size(plan.path);
  if (!size || *size < plan.end() || (plan.verify && plan.op != Op::Read)) {
    progress.set("laying out the file");
    lay_out(handle, file.get(), plan);
  }
  std::vector<OpResult> results;
  if (plan.op != Op::Read) {
    results.push_back(random_op(handle, file.get(), state, plan, Op::Write, progress));
  }
  if (plan.op != Op::Write) {
    results.push_back(random_op(handle, file.get(), state, plan, Op::Read, progress));
  }
  if (!plan.verify) return results;
  if (plan.op == Op::Write) {
    check_file(handle, file.get(), plan, results[0]);
  } else if (plan.op == Op::Both) {
    results[0].verified = results[1].verified;  // the reads checked what the writes stored
  }
  return results;
}

// ---- output -------------------------------------------------------------------------------------

// A random result's own keys: the medians over loops of the operations, the rates and the latency
// percentiles, and each loop's figures.
void add_random_json(nlohmann::json& j, const OpResult& r) {
  nlohmann::json ops = nlohmann::json::array();
  nlohmann::json iops = nlohmann::json::array();
  nlohmann::json latency = nlohmann::json::array();
  for (const Sample& s : r.samples) {
    ops.push_back(s.ops);
    iops.push_back(static_cast<double>(s.ops) / s.seconds);
    latency.push_back({s.p50_us, s.p99_us, s.p999_us});
  }
  const double median_ops = median_of(r, [](const Sample& s) { return s.ops; });
  j["block_bytes"] = r.bytes;
  j["bytes"] = static_cast<std::uint64_t>(std::llround(median_ops)) * r.bytes;
  j["ops"] = std::llround(median_ops);
  j["ops_all"] = ops;
  j["iops"] = median_of(r, [](const Sample& s) { return static_cast<double>(s.ops) / s.seconds; });
  j["iops_all"] = iops;
  j["gb_per_s"] = median_of(r, [&](const Sample& s) { return loop_bytes(r, s) / s.seconds / 1e9; });
  j["gib_per_s"] =
      median_of(r, [&](const Sample& s) { return loop_bytes(r, s) / s.seconds / (1 << 30); });
  j["lat_p50_us"] = median_of(r, [](const Sample& s) { return s.p50_us; });
  j["lat_p99_us"] = median_of(r, [](const Sample& s) { return s.p99_us; });
  j["lat_p999_us"] = median_of(r, [](const Sample& s) { return s.p999_us; });
  j["lat_us_all"] = latency;
}

// A striped run: each drive's bytes, median seconds until its last byte, and the GB/s of those
// (not the median of the loops' rates, which differs from it when the loops are even in number).
nlohmann::json drives_json(const OpResult& r, const Plan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t d = 0; d < r.drive_bytes.size(); ++d) {
    const auto bytes = static_cast<double>(r.drive_bytes[d]);
    const double seconds = median_of(r, [&](const Sample& s) { return s.drive_seconds.at(d); });
    out.push_back({{"directory", plan.stripe_dirs.at(d)},
                   {"bytes", r.drive_bytes[d]},
                   {"seconds", seconds},
                   {"gb_per_s", seconds > 0 ? bytes / seconds / 1e9 : 0.0}});
  }
  return out;
}

// The counters by name (nvio::handle_stats_fields) and "errors": failed operations by errno, whose
// keys are the errno numbers as strings.
nlohmann::json stats_json(const nvio::HandleStats& stats) {
  nlohmann::json j = nlohmann::json::object();
  for (const nvio::HandleStatsField& f : nvio::handle_stats_fields()) j[f.name] = stats.*f.member;
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [err, count] : stats.errors) errors[std::to_string(err)] = count;
  j["errors"] = errors;
  return j;
}

nlohmann::json result_json(const OpResult& r, const nvio::Handle& handle, const Plan& plan) {
  double seconds = median_seconds(r);
  double bytes = static_cast<double>(r.bytes);
  nlohmann::json all = nlohmann::json::array();
  for (const Sample& s : r.samples) all.push_back(s.seconds);
  nlohmann::json j = {
      {"op", r.op},
      {"engine", nvio::to_string(handle.engine())},
      {"bytes", r.bytes},
      {"seconds", seconds},
      {"gb_per_s", seconds > 0 ? bytes / seconds / 1e9 : 0.0},
      {"gib_per_s", seconds > 0 ? bytes / seconds / (1024.0 * 1024 * 1024) : 0.0},
      {"cpu_s_per_gb", median_cpu_s_per_gb(r)},
      {"verified", r.verified ? nlohmann::json(*r.verified) : nlohmann::json(nullptr)},
      {"synced", plan.sync && std::string_view(r.op) == "write"},
      {"loops", r.samples.size()},
      {"seconds_all", all},
      {"stats", r.stats ? stats_json(*r.stats) : nlohmann::json(nullptr)}};
  if (plan.pattern == Pattern::Random) add_random_json(j, r);
  if (!r.drive_bytes.empty()) j["drives"] = drives_json(r, plan);
  if (plan.gate) {
    nlohmann::json starts = nlohmann::json::array();
    nlohmann::json ends = nlohmann::json::array();
    for (const Sample& s : r.samples) {
      starts.push_back(std::chrono::nanoseconds(s.start.time_since_epoch()).count());
      ends.push_back(std::chrono::nanoseconds(s.end.time_since_epoch()).count());
    }
    j["start_ns_all"] = starts;
    j["end_ns_all"] = ends;
  }
  return j;
}

void print_json(const std::vector<OpResult>& results, const nvio::Handle& handle,
                const Plan& plan) {
  nlohmann::json out;
  out["results"] = nlohmann::json::array();
  for (const OpResult& r : results) out["results"].push_back(result_json(r, handle, plan));
  out["options"] = options_to_json(handle.options());
  out["engine"] = nvio::to_string(handle.engine());
  out["engine_reason"] = handle.engine_reason();
  out["options_sources"] = sources_to_json(plan.options);
  out["config"] = config_to_json(plan.options);
  out["file"] = plan.path;
  if (!plan.stripe_dirs.empty()) {
    nlohmann::json drives = nlohmann::json::array();
    for (const nvio::EffectiveOptions& eff : plan.drive_options) {
      drives.push_back({{"options", options_to_json(eff.values)},
                        {"options_sources", sources_to_json(eff)},
                        {"config", config_to_json(eff)}});
    }
    out["stripe"] = {
        {"directories", plan.stripe_dirs}, {"stripe_size", plan.stripe_size}, {"drives", drives}};
  }
  out["size"] = plan.size;
  out["pattern"] = plan.pattern == Pattern::Random ? "random" : "sequential";
  if (plan.pattern == Pattern::Sequential) {
    out["offset"] = plan.offset;
  } else {
    const RandomPlan& r = plan.random;
    out["file_size"] = r.file_size;
    out["ops_limit"] = r.ops ? nlohmann::json(*r.ops) : nlohmann::json(nullptr);
    out["duration_s"] = r.duration ? nlohmann::json(*r.duration) : nlohmann::json(nullptr);
    out["outstanding"] = r.outstanding;
    out["batch"] = r.batch;
  }
  out["memory"] = memory_name(plan);
  if (plan.memory != Plan::Memory::Host) {
    const nvio::GpuInfo& gpu = nvio::gpu_info();
    out["device"] = {{"ordinal", plan.device},
                     {"name", gpu.devices.at(static_cast<std::size_t>(plan.device)).name},
                     {"gds_mode", nvio::to_string(gpu.gds_mode)},
                     {"gds_reason", gpu.gds_reason}};
  }
  out["version"] = nvio::version();
  fmt::print("{}\n", out.dump(2));
}

void print_random_rows(const std::vector<OpResult>& results, const nvio::Handle& handle,
                       const Plan& plan) {
  fmt::print(
      "GB/s = 1e9 bytes/s; latency = submission to completion seen, in us{}; all "
      "figures are medians over loops\n\n",
      plan.random.batch > 1 ? " (each operation of a batch gets the batch's)" : "");
  fmt::print("{:<6} {:>10} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "op", "ops",
             "seconds", "IOPS", "GB/s", "p50 us", "p99 us", "p99.9 us", "CPU s/GB", "verified");
  for (const OpResult& r : results) {
    nlohmann::json j = result_json(r, handle, plan);
    std::string verified = r.verified ? (*r.verified ? "yes" : "NO") : "-";
    fmt::print(
        "{:<6} {:>10} {:>8.3f} {:>10.0f} {:>8.3f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.4f} {:>9}\n",
        r.op, j["ops"].get<std::int64_t>(), j["seconds"].get<double>(), j["iops"].get<double>(),
        j["gb_per_s"].get<double>(), j["lat_p50_us"].get<double>(), j["lat_p99_us"].get<double>(),
        j["lat_p999_us"].get<double>(), j["cpu_s_per_gb"].get<double>(), verified);
  }
}

// Every option but the engine, as resolved: "block_size 1 MiB, queue_depth 8, ...".
std::string settings_text(const nvio::Options& o) {
  std::string settings;
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    if (std::string_view(spec.name) == "engine") continue;
    const nvio::OptionValue value = o.get(spec.name);
    const std::string text =
        std::string_view(spec.unit) == "bytes"
            ? human_bytes(static_cast<unsigned long long>(std::get<std::int64_t>(value)))
            : std::visit([](const auto& v) { return fmt::format("{}", v); }, value);
    settings += fmt::format("{}{} {}", settings.empty() ? "" : ", ", spec.name, text);
  }
  return settings;
}

void print_table(const std::vector<OpResult>& results, const nvio::Handle& handle,
                 const Plan& plan) {
  const nvio::Options& o = handle.options();
  if (plan.pattern == Pattern::Random) {
    const RandomPlan& r = plan.random;
    const std::string until = r.ops && r.duration
                                  ? fmt::format("{} ops or {} s", *r.ops, *r.duration)
                              : r.ops ? fmt::format("{} ops", *r.ops)
                                      : fmt::format("{} s", *r.duration);
    fmt::print(
        "nvio bench: random {} ({} bytes) blocks over {} of file {}, {} in flight, {} per "
        "submission, {} loop(s) of {}\n",
        human_bytes(plan.size), plan.size, human_bytes(r.file_size), plan.path, r.outstanding,
        r.batch, plan.loops, until);
  } else {
    fmt::print("nvio bench: {} ({} bytes){}, {} loop(s), file {}\n", human_bytes(plan.size),
               plan.size, plan.offset ? fmt::format(" at offset {}", plan.offset) : "", plan.loops,
               plan.path);
    if (!plan.stripe_dirs.empty()) {
      fmt::print("striped over {} drives in {} stripes, one handle each: {}\n",
                 plan.stripe_dirs.size(), human_bytes(plan.stripe_size),
                 fmt::join(plan.stripe_dirs, ", "));
    }
  }
  // The engine in use (never auto) and why, then every other option as resolved.
  fmt::print("engine {} ({}); {}\n", nvio::to_string(handle.engine()), handle.engine_reason(),
             settings_text(o));
  for (std::size_t d = 0; d < plan.drive_options.size(); ++d) {
    const nvio::EffectiveOptions& eff = plan.drive_options[d];
    fmt::print("  drive {}: engine {}; {}{}\n", plan.stripe_dirs[d],
               nvio::to_string(eff.values.engine), settings_text(eff.values),
               eff.config_profile.empty() ? "" : fmt::format(" (profile {})", eff.config_profile));
  }
  if (!plan.options.config_profile.empty()) {
    fmt::print("settings from {} (profile {}): {}\n", plan.options.config_path,
               plan.options.config_profile, configured_names(plan.options));
  }
  if (plan.memory != Plan::Memory::Host) {
    const nvio::GpuInfo& gpu = nvio::gpu_info();
    fmt::print("memory {} on device {} ({}); GDS {} ({})\n", memory_name(plan), plan.device,
               gpu.devices.at(static_cast<std::size_t>(plan.device)).name,
               nvio::to_string(gpu.gds_mode), gpu.gds_reason);
  }
  if (plan.pattern == Pattern::Random) {
    print_random_rows(results, handle, plan);
    return;
  }
  fmt::print("GB/s = 1e9 bytes/s, GiB/s = 2^30 bytes/s; seconds and CPU s/GB are medians\n\n");
  fmt::print("{:<6} {:>14} {:>10} {:>9} {:>9} {:>10} {:>9}\n", "op", "bytes", "seconds", "GB/s",
             "GiB/s", "CPU s/GB", "verified");
  for (const OpResult& r : results) {
    nlohmann::json j = result_json(r, handle, plan);
    std::string verified = r.verified ? (*r.verified ? "yes" : "NO") : "-";
    fmt::print("{:<6} {:>14} {:>10.4f} {:>9.3f} {:>9.3f} {:>10.4f} {:>9}\n", r.op, r.bytes,
               j["seconds"].get<double>(), j["gb_per_s"].get<double>(),
               j["gib_per_s"].get<double>(), j["cpu_s_per_gb"].get<double>(), verified);
    if (!j.contains("drives")) continue;
    for (const auto& d : j["drives"]) {
      fmt::print("  drive {:>14} {:>10.4f} {:>9.3f} {:>9.3f}  {}\n",
                 d["bytes"].get<std::uint64_t>(), d["seconds"].get<double>(),
                 d["gb_per_s"].get<double>(), d["gb_per_s"].get<double>() * 1e9 / (1 << 30),
                 d["directory"].get<std::string>());
    }
  }
}

// Prints the verification failure, if any, and returns whether everything verified.
bool report_verification(const std::vector<OpResult>& results, const nvio::Handle& handle) {
  for (const OpResult& r : results) {
    if (!r.bad_offset) continue;
    std::fprintf(stderr, "nvio: verify failed: first bad byte at file offset %llu (engine %s)\n",
                 static_cast<unsigned long long>(*r.bad_offset), nvio::to_string(handle.engine()));
    return false;
  }
  return true;
}

}  // namespace

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
    const std::optional<std::uint64_t> free = nvio::detail::free_space(where.empty() ? "." : where);
    if (free && each - have > *free) {
      throw nvio::NoSpace(nvio::IoOp::Write, p, have, each - have, ENOSPC,
                          fmt::format("the run needs {} more bytes there and {} are free (use a "
                                      "smaller --size or --file-size)",
                                      each - have, *free));
    }
  }
}

int run_bench(const BenchArgs& args) {
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
