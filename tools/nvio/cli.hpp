// Declarations shared by the translation units of the `nvio` command-line tool.
//
// Each subcommand has an argument struct that CLI11 fills in main.cpp, a function that registers
// its flags, and a function that runs it and returns the process exit code. Argument values are
// kept as the strings the user typed and parsed with nvio's own strict parsers, so that a bad value
// is reported with the same wording as an NVIO_* environment variable would be.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvio/gpu.hpp"
#include "nvio/options.hpp"
#include "nvio/tune.hpp"

namespace CLI {
class App;
}

namespace nvio_cli {

// Exit codes of the tool.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an I/O error, a failed verification, ...
inline constexpr int kExitUsage = 2;    // bad arguments or options

// A command-line mistake that the library's parsers do not cover (e.g. neither --dir nor --file).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BenchArgs {
  // One directory: a scratch file in it. Several: a scratch file striped over them (one drive
  // each), with per-drive figures.
  std::vector<std::string> dirs;
  std::optional<std::string> stripe_size;  // several --dir: default 1M
  std::optional<std::string> file;
  std::optional<std::string> size;  // unset: 1G for --pattern sequential, 4K for random
  std::optional<std::string> op;    // unset: both, but an existing --file then is not overwritten
  std::string pattern = "sequential";
  std::optional<std::string> offset;  // sequential: the file offset the transfer starts at
  // --pattern random only: the file's size, when to stop, operations in flight and per submission.
  std::optional<std::string> file_size;
  std::optional<std::string> ops;
  std::optional<std::string> duration;
  std::optional<std::string> outstanding;
  std::optional<std::string> batch;
  std::string loops = "3";
  std::optional<std::string> seed;
  // Handle options given on the command line, keyed by option name (one flag per row of the option
  // table; a boolean option has --NAME and --no-NAME): the text as typed ("true"/"false" for a
  // boolean flag) and the flag, for messages. Unset ones fall through to the configuration file,
  // NVIO_* variables and defaults.
  struct OptionFlag {
    std::string flag;
    std::string text;
  };
  std::map<std::string, OptionFlag> options;
  bool verify = false;
  bool sync = false;  // sequential writes end with fdatasync, timed
  bool keep = false;
  bool json = false;
  // Device memory: --gpu moves data between a cuMemAlloc buffer and the file (bounce path),
  // --gds through cuFile; --h2d-only measures pinned host<->device copies and touches no file.
  bool gpu = false;
  bool gds = false;
  bool h2d_only = false;
  std::string device = "0";
  bool device_given = false;  // --device typed: refused without --gpu, which alone uses it
  // Several processes (procs.cpp): --procs N, and --device-map DIR:ORDINAL (one process each).
  std::optional<std::string> procs;
  std::vector<std::string> device_map;
  // Set by the parent of a --procs run in each process it forks (never from the command line):
  // the process's rank and the two ends of its loop barrier (see LoopGate in procs.hpp).
  struct ProcRole {
    unsigned rank = 0;
    int ready_fd = -1;
    int go_fd = -1;
  };
  std::optional<ProcRole> role;
};

struct TuneArgs {
  // One directory: tune its drive. Several: tune each drive alone, then measure them together
  // (a file striped over them, each drive with its pick).
  std::vector<std::string> dirs;
  std::optional<std::string> stripe_size;  // several --dir: default 1M
  std::string size = "1G";
  std::string budget = "60";
  bool budget_given = false;  // --budget typed: refused with --grid, which ignores it
  std::optional<std::string> trial_size;
  std::optional<std::string> engines;
  bool read_only = false;
  bool write_only = false;
  bool grid = false;
  bool json = false;
  bool save = false;
  bool keep = false;
  // Device memory: --gpu measures trials that move a cuMemAlloc buffer (the host bounce path,
  // gpu_direct=off), --gds adds cuFile (gpu_direct=on) to the search.
  bool gpu = false;
  bool gds = false;
  std::string device = "0";
  bool device_given = false;  // --device typed: refused without --gpu, which alone uses it
};

struct ReportArgs {
  std::string dir = ".";
  bool dir_given = false;  // --dir named: a directory that cannot be probed is an error then
  bool json = false;
  std::vector<std::string> cached;  // files whose page-cache residency to show
};

struct EvictArgs {
  std::vector<std::string> paths;
};

// `nvio ds-io` and `nvio ds-nvme-tune` (ds_compat.cpp): DeepSpeed's ds_io / ds_nvme_tune flags,
// mapped onto bench and tune. Values stay as typed until the mapping parses them.
struct DsIoArgs {
  std::optional<std::string> folder;
  std::vector<std::string> folder_to_device_mapping;
  std::optional<std::string> io_size;
  bool read = false;
  std::optional<std::string> multi_process;
  std::optional<std::string> block_size;
  std::optional<std::string> queue_depth;
  bool single_submit = false;
  bool sequential_requests = false;
  std::optional<std::string> io_parallel;
  std::optional<std::string> loops;
  std::optional<std::string> warmup_loops;
  bool validate = false;
  bool gpu = false;
  bool use_gds = false;
  bool handle = false;
  bool use_accelerator_pin_memory = false;
  std::optional<std::string> engine;  // only ds_io's default, aio_handle, is nvio's
  bool include_warmup_time = false;
  bool json = false;
  std::vector<std::string> refused;  // DeepSpeed flags given that nvio cannot honour
};

struct DsTuneArgs {
  std::vector<std::string> nvme_dir;
  std::optional<std::string> sweep_config;
  bool no_read = false;
  bool no_write = false;
  std::string io_size = "400M";
  bool gpu = false;
  bool gds = false;
  bool flush_page_cache = false;
  std::optional<std::string> log_dir;
  std::optional<std::string> loops;
  bool verbose = false;
  bool json = false;
};

// Register the subcommand's flags on `app` (the subcommand itself), storing values into `args`.
void add_bench_options(CLI::App& app, BenchArgs& args);
void add_report_options(CLI::App& app, ReportArgs& args);
void add_tune_options(CLI::App& app, TuneArgs& args);
void add_evict_options(CLI::App& app, EvictArgs& args);
void add_procs_options(CLI::App& app, BenchArgs& args);
void add_ds_io_options(CLI::App& app, DsIoArgs& args);
void add_ds_nvme_tune_options(CLI::App& app, DsTuneArgs& args);

// Run a parsed subcommand. Throw UsageError / nvio::InvalidArgument for bad arguments (exit 2)
// and other exceptions for failures (exit 1); return the exit code otherwise.
int run_bench(const BenchArgs& args);
int run_report(const ReportArgs& args);
int run_tune(const TuneArgs& args);
int run_evict(const EvictArgs& args);
int run_ds_io(const DsIoArgs& args);
int run_ds_nvme_tune(const DsTuneArgs& args);
// Replaces the process with Python running nvio.ckpt_bench with `forwarded` (ckpt.cpp); returns
// only by throwing, when Python cannot be started.
[[noreturn]] void run_ckpt_bench(const std::vector<std::string>& forwarded);
// A bench with --procs or --device-map: forks the processes, runs their barriers and prints the
// per-process and aggregate results.
int run_bench_procs(const BenchArgs& args);
bool wants_procs(const BenchArgs& args);

// The scratch file that `nvio bench --dir DIR` run by process `pid` writes: its name (also the
// name of a striped scratch file's parts), and its path.
std::string scratch_name(long pid);
std::string scratch_path(const std::string& dir, long pid);

// SIGINT, SIGTERM and SIGHUP stop the library's blocking calls on this thread while the object
// lives: for runs whose scratch files the library owns (tune writes nvio-tune.*.dat). The handler
// only records the signal; the calls ask every nvio::kInterruptPeriod (interrupt.hpp), then
// cancel, wait for the kernel and throw nvio::Interrupted, so the file's owner removes it as the
// exception unwinds. report_current_exception() then names the signal and the process ends by it
// (status 128 + N, as a shell expects). One at a time, on the main thread.
class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};
// The signal a StopOnSignals recorded (0 for none).
int stop_signal() noexcept;
// Ends the process by `sig`, as it would have ended without a handler: the status a shell
// expects (128 + N). stdout is flushed first.
void end_by_signal(int sig);

// Prints the exception being handled as the one "nvio: error:" line and returns the exit code it
// maps to (kExitUsage for UsageError and nvio::InvalidArgument, kExitFailure otherwise). Call it
// only inside a catch block.
int report_current_exception();

// The most processes `nvio bench --procs` (ds-io --multi_process) starts: more is a typo, not a
// benchmark (each holds a buffer of --size bytes).
inline constexpr std::size_t kMaxProcs = 1024;

// The smallest trial `nvio tune --trial-size` and `ds-nvme-tune --io_size` take: below it a trial
// times little but the calls themselves.
inline constexpr std::uint64_t kMinTrialBytes = std::uint64_t{1} << 20;

// The tune request that `nvio tune` runs for `args` on directory `dir` (flags parsed and checked).
nvio::TuneRequest make_tune_request(const TuneArgs& args, const std::string& dir);
// --gpu/--gds/--device of a tune: the device ordinal (0 without --gpu), once the GPU and, for
// --gds, cuFile are known to be usable; UsageError (exit 2) before anything is written otherwise.
int check_tune_gpu_flags(const TuneArgs& args);
// With --gpu: device memory of the trial size in `buffer`, moved by every trial of `req`, and with
// --gds cuFile (gpu_direct on) added to its space. Returns what the trials move, for the output.
std::string attach_device_memory(const TuneArgs& args, int device, nvio::TuneRequest& req,
                                 std::optional<nvio::DeviceBuffer>& buffer);

// The handle options as JSON, keyed by the option names of nvio::EffectiveOptions::sources.
nlohmann::json options_to_json(const nvio::Options& options);

// Where each option's value came from ({"engine": "config", ...}), the configuration file that
// was consulted ({"path", "found", "profile"}), and the names of the options it set ("a, b").
nlohmann::json sources_to_json(const nvio::EffectiveOptions& options);
nlohmann::json config_to_json(const nvio::EffectiveOptions& options);
std::string configured_names(const nvio::EffectiveOptions& options);

// Renders a byte count for people: "1 GiB", "4 KiB", or plain bytes when not a whole unit.
std::string human_bytes(unsigned long long bytes);

// The most memory a run can take for its buffers, and what sets it: MemAvailable of
// /proc/meminfo, or the address-space limit (RLIMIT_AS) or the cgroup's memory.max (less what the
// cgroup holds) where lower. nullopt when none of them can be read.
struct MemoryRoom {
  std::uint64_t bytes = 0;
  std::string source;  // "MemAvailable in /proc/meminfo", "RLIMIT_AS (ulimit -v)", ...
};
std::optional<MemoryRoom> memory_room();

// Creates a --dir that does not exist yet, with its parents (as mkdir -p). Throws
// std::filesystem::filesystem_error naming the directory when that fails.
void make_directory(const std::string& dir);

// --device N, for the subcommands that take --gpu.
void add_device_option(CLI::App& app, std::string& device, bool& given);

// The CUDA device ordinal that --device names; throws nvio::InvalidArgument / UsageError for text
// that is not one.
int parse_device(const std::string& text);

// Throws UsageError unless `device` is the ordinal of a usable GPU here, saying why not (no
// driver, no device, or how many there are).
void require_gpu(int device);

}  // namespace nvio_cli
