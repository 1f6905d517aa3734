// `nvio bench`'s flags (add_bench_options) and their parsing into a Plan (make_plan): every
// value parsed with nvio's strict parsers and checked against the others before any file is
// touched, so that a mistyped run fails at once with the flag named.
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

namespace {

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

using bench::kMaxOpsPerSecond;

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

std::string scratch_name(long pid) { return fmt::format("nvio-bench-{}.dat", pid); }

std::string scratch_path(const std::string& dir, long pid) {
  return (std::filesystem::path(dir) / scratch_name(pid)).string();
}

namespace bench {

namespace {

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

}  // namespace bench
}  // namespace nvio_cli
