// `nvio tune`: searches handle options for a directory within a time budget, prints the best ones
// for read, write and mixed use (and DeepSpeed's "aio" section), and with --save writes them to the
// configuration file that nvio then uses by default. With --gpu the trials move GPU memory (the
// host bounce path), and --gds adds cuFile to the search as gpu_direct=on.
#include "nvio/tune.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "cli.hpp"
#include "nvio/config.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"
#include "nvio/stripe.hpp"
#include "nvio/system.hpp"

namespace nvio_cli {

using nlohmann::json;

void add_tune_options(CLI::App& app, TuneArgs& args) {
  app.add_option("--dir", args.dirs,
                 "Directory on the drive to tune (created if missing; a scratch file goes there). "
                 "Repeat it for several drives: each is tuned alone (an equal share of 80% of the "
                 "budget), then all are measured together, each with its pick, by writing and "
                 "reading a --size file striped over them 3 times (timed apart from the budget); "
                 "--save saves each drive's profile")
      ->required()
      ->type_name("DIR");
  app.add_option("--stripe-size", args.stripe_size,
                 "With several --dir: bytes per stripe of the file measured on all drives "
                 "together, a multiple of 4K (default 1M)")
      ->type_name("BYTES");
  app.add_option("--size", args.size, "Scratch file size (K/M/G suffixes)")
      ->type_name("BYTES")
      ->capture_default_str();
  app.add_option("--budget", args.budget, "Seconds to spend, setup included (not with --grid)")
      ->each([&args](const std::string&) { args.budget_given = true; })
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_option("--trial-size", args.trial_size,
                 "Bytes per measurement (default: about 0.25 s worth at the drive's write speed)")
      ->type_name("BYTES");
  auto* ro = app.add_flag("--read-only", args.read_only, "Tune reads only");
  auto* wo = app.add_flag("--write-only", args.write_only, "Tune writes only");
  ro->excludes(wo);
  app.add_option("--engines", args.engines, "Comma-separated engines to try (default: available)")
      ->type_name("LIST");
  app.add_flag("--grid", args.grid,
               "Measure every configuration of the space instead of searching (slow; for "
               "checking the search)");
  app.add_flag("--json", args.json, "Print every measured point as one JSON object");
  app.add_flag("--save", args.save,
               "Save the pick (mixed, else read or write) as this drive's default settings");
  app.add_flag("--keep", args.keep, "Keep the scratch file");
  app.add_flag("--gpu", args.gpu,
               "Trials move GPU memory (cuMemAlloc) through the host bounce path (gpu_direct=off)");
  app.add_flag("--gds", args.gds,
               "With --gpu: also try cuFile / GPUDirect Storage (gpu_direct=on) and pick between "
               "the two");
  add_device_option(app, args.device, args.device_given);
}

namespace {

double parse_budget(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(v) || v <= 0 || v > 86400) {
    throw UsageError("--budget: expected seconds between 0 and 86400, got '" + text + "'");
  }
  return v;
}

std::vector<nvio::EngineKind> parse_engines(const std::string& list) {
  if (!list.empty() &&
      (list.front() == ',' || list.back() == ',' || list.find(",,") != std::string::npos)) {
    throw UsageError(fmt::format("--engines: '{}' has an empty item", list));
  }
  std::vector<nvio::EngineKind> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    // Auto, repeated and unavailable engines are refused by the tuner itself, for Python too.
    out.push_back(nvio::parse_engine(item, "--engines"));
  }
  if (out.empty()) throw UsageError("--engines: the list is empty");
  return out;
}

// gpu_direct is a column only for device memory, which alone consults it.
std::string describe(const nvio::Options& o, nvio::MemoryKind memory) {
  std::string out = fmt::format("{:<9} {:>8} {:>4} {:>4}  {:<6} {:<7} {:<6}",
                                nvio::to_string(o.engine), human_bytes(o.block_size), o.queue_depth,
                                o.intra_op_parallelism, o.single_submit ? "true" : "false",
                                o.overlap_events ? "true" : "false", nvio::to_string(o.direct));
  if (memory == nvio::MemoryKind::Device) out += fmt::format(" {}", nvio::to_string(o.gpu_direct));
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// `memory`: what the trials moved, in words.
void print_table(const nvio::TuneResult& r, const std::string& memory) {
  const std::size_t measured = [&] {
    std::size_t n = 0;
    for (const auto& p : r.points) n += p.samples.size();
    return n;
  }();
  fmt::print("nvio tune: {} ({}, {}), {} file, {} per trial, {}\n", r.directory, r.filesystem,
             r.device, human_bytes(r.file_size), human_bytes(r.trial_bytes), memory);
  if (r.strategy == nvio::TuneStrategy::Grid) {
    fmt::print("grid: {} configurations, {} trials in {:.1f} s\n\n", r.points.size(), measured,
               r.elapsed_s);
  } else {
    fmt::print("search: {} configurations, {} trials in {:.1f} s of a {:.0f} s budget\n\n",
               r.points.size(), measured, r.elapsed_s, r.budget_s);
  }
  const bool device = r.memory == nvio::MemoryKind::Device;
  fmt::print("{:<6} {:>7} {:>8} {:>8} {:>9}  {:<9} {:>8} {:>4} {:>4}  {:<6} {:<7} {}{}\n", "mode",
             "GB/s", "spread", "repeats", "CPU s/GB", "engine", "block", "qd", "par", "single",
             "overlap", device ? "direct " : "direct", device ? "gpu_direct" : "");
  for (const auto& [name, pick] : {std::pair{"read", r.read}, std::pair{"write", r.write}}) {
    if (!pick) continue;
    fmt::print("{:<6} {:>7.3f} {:>7.1f}% {:>8} {:>9.3f}  {}\n", name, pick->gbps,
               pick->spread * 100, pick->repeats, pick->cpu_seconds_per_gb,
               describe(pick->options, r.memory));
  }
  if (r.mixed) {
    fmt::print("{:<6} {:>7.3f} {:>8} {:>8} {:>9}  {}\n", "mixed", r.mixed->mixed_gbps, "", "", "",
               describe(r.mixed->options, r.memory));
    fmt::print(
        "       (read {:.3f} GB/s, write {:.3f} GB/s; mixed = harmonic mean, equal bytes "
        "each way)\n",
        r.mixed->read_gbps, r.mixed->write_gbps);
  }
  fmt::print("\nHow sure: spread is (max - min) / median over the pick's repeats.");
  for (const auto& [name, pick] : {std::pair{"read", r.read}, std::pair{"write", r.write}}) {
    if (!pick || pick->runner_up_gbps <= 0) continue;
    const double margin = pick->gbps / pick->runner_up_gbps - 1;
    fmt::print(" {} beats the next best by {:.1f}%{}.", name, margin * 100,
               margin < pick->spread ? " (within the spread: a near tie)" : "");
  }
  fmt::print("\n");
  for (const std::string& w : r.warnings) fmt::print("note: {}\n", w);
  const nvio::Options best = r.recommended();
  const json doc = json::parse(nvio::to_json(r));
  fmt::print("\nDeepSpeed config, \"aio\" section for the {} pick:\n{}\n",
             doc["recommended"].get<std::string>(), doc["deepspeed"].dump(2));
  if (best.engine != nvio::EngineKind::Libaio || best.direct != nvio::DirectIo::On) {
    fmt::print(
        "(DeepSpeed itself always uses libaio with O_DIRECT; nvio's aio_handle also takes "
        "engine {} and direct {} from the saved configuration)\n",
        nvio::to_string(best.engine), nvio::to_string(best.direct));
  }
}

// A live progress line on stderr, only when stderr is a terminal (never in logs or pipes).
class ProgressLine {
 public:
  ProgressLine() : enabled_(::isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { clear(); }
  // Erases the line so that the results start on a clean one.
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void update(const nvio::TuneProgress& p) {
    if (!enabled_) return;
    shown_ = true;
    std::string best = "-";
    if (p.best) {
      const nvio::Options& o = p.best->options;
      best = fmt::format("{:.2f} GB/s {} {} qd{} x{}", p.best->gbps, nvio::to_string(o.engine),
                         human_bytes(o.block_size), o.queue_depth, o.intra_op_parallelism);
    }
    const std::string clock = p.budget_s > 0
                                  ? fmt::format("{:5.1f}/{:.0f} s", p.elapsed_s, p.budget_s)
                                  : fmt::format("{:6.1f} s", p.elapsed_s);
    std::fprintf(stderr, "\r\033[K%s  %-5s %-7s %4zu points  best %s", clock.c_str(),
                 nvio::to_string(p.mode), p.phase.c_str(), p.points, best.c_str());
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

}  // namespace

int check_tune_gpu_flags(const TuneArgs& args) {
  if (args.gds && !args.gpu) throw UsageError("--gds needs --gpu");
  if (args.device_given && !args.gpu) throw UsageError("--device applies with --gpu only");
  if (!args.gpu) return 0;
  const int device = parse_device(args.device);
  require_gpu(device);
  // Tuning cuFile where it falls back to the bounce path would measure the bounce path twice.
  const nvio::GpuInfo& gpu = nvio::gpu_info();
  if (args.gds && gpu.gds_mode == nvio::GdsMode::Unavailable) {
    throw UsageError("--gds: cuFile cannot be used here: " + gpu.gds_reason);
  }
  return device;
}

std::string attach_device_memory(const TuneArgs& args, int device, nvio::TuneRequest& req,
                                 std::optional<nvio::DeviceBuffer>& buffer) {
  if (!args.gpu) return "host memory";
  buffer.emplace(
      static_cast<std::size_t>(req.trial_bytes != 0 ? req.trial_bytes
                                                    : nvio::max_auto_trial_bytes(req.file_size)),
      device);
  req.device_memory = nvio::TuneDeviceMemory{buffer->data(), buffer->size()};
  if (args.gds) req.space.gpu_direct = {nvio::GpuDirect::Off, nvio::GpuDirect::On};
  const nvio::GpuInfo& gpu = nvio::gpu_info();
  return fmt::format("GPU {} ({}) memory, GDS {}", device,
                     gpu.devices.at(static_cast<std::size_t>(device)).name,
                     nvio::to_string(gpu.gds_mode));
}

nvio::TuneRequest make_tune_request(const TuneArgs& args, const std::string& dir) {
  nvio::TuneRequest req;
  req.directory = dir;
  req.file_size = nvio::parse_size(args.size, "--size");
  if (args.trial_size) {
    req.trial_bytes = nvio::parse_size(*args.trial_size, "--trial-size");
    // 0 meant the automatic size, and a trial of a few bytes times nothing but the calls.
    if (req.trial_bytes < kMinTrialBytes) {
      throw UsageError(fmt::format(
          "--trial-size: {} is below 1 MiB, too little to time (leave it out for the automatic "
          "size)",
          *args.trial_size));
    }
  }
  if (args.grid && args.budget_given) {
    throw UsageError("--budget does not apply with --grid, which measures every combination");
  }
  req.settings.budget_s = parse_budget(args.budget);
  req.settings.strategy = args.grid ? nvio::TuneStrategy::Grid : nvio::TuneStrategy::Search;
  if (args.read_only) req.settings.modes = {nvio::TuneMode::Read};
  if (args.write_only) req.settings.modes = {nvio::TuneMode::Write};
  if (args.engines) req.space.engines = parse_engines(*args.engines);
  req.keep_file = args.keep;
  return req;
}

namespace {

// Where --save writes, settled (and an existing file checked) before a minute is spent measuring.
std::string save_path(const TuneArgs& args) {
  if (!args.save) return {};
  const std::string config = nvio::config_path();
  if (config.empty()) {
    throw UsageError("--save: no configuration file: NVIO_CONFIG is 'none', or HOME is not set");
  }
  nvio::load_config(config);  // a malformed file is reported now, not after
  // The file is replaced through a temporary file and a lock file beside it: its directory (or
  // the nearest existing one above it, where the missing ones would be made) must take new files.
  // Found now, not after the whole budget was spent measuring.
  std::filesystem::path dir = std::filesystem::path(config).parent_path();
  std::error_code ec;
  while (!dir.empty() && !std::filesystem::exists(dir, ec)) dir = dir.parent_path();
  const std::string where = dir.empty() ? "." : dir.string();
  if (::access(where.c_str(), W_OK) != 0) {
    throw nvio::IoError(nvio::IoOp::Open, config, 0, 0, errno,
                        fmt::format("--save: {} does not take new files", where));
  }
  return config;
}

void save_result(const nvio::TuneResult& result, const std::string& config, bool json) {
  const nvio::ConfigProfile profile = nvio::to_profile(result);
  nvio::save_profile(config, profile);
  std::fprintf(json ? stderr : stdout,
               "saved to %s as profile %s (and the default); NVIO_* variables and explicit "
               "options still take precedence\n",
               config.c_str(), profile.key.c_str());
}

// The drive behind a directory: its file system's device ("dev:MAJOR:MINOR", the profile key),
// or for a partition the whole disk it is on (sysfs: a partition's directory sits in its disk's),
// so that two partitions of one NVMe drive are one drive too.
std::string drive_of(const std::string& dir) {
  const std::string key = nvio::device_key(dir);
  std::error_code ec;
  const std::filesystem::path sys =
      std::filesystem::canonical("/sys/dev/block/" + key.substr(key.find(':') + 1), ec);
  if (ec) return key;
  if (std::filesystem::exists(sys / "partition", ec)) return sys.parent_path().filename().string();
  return sys.filename().string();
}

// Directories on one drive: striping over them does not add a drive, and adding up their figures
// alone counts that drive more than once. One warning per directory that shares an earlier one's.
std::vector<std::string> shared_drive_warnings(const std::vector<std::string>& dirs,
                                               const std::vector<std::string>& drives) {
  std::vector<std::string> warnings;
  for (std::size_t i = 1; i < dirs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (drives[i] != drives[j]) continue;
      warnings.push_back(fmt::format(
          "--dir {} and --dir {} are on one drive ({}): the striped figure is that drive's, not "
          "of separate drives, and the sum of the drives alone counts it once",
          dirs[j], dirs[i], drives[i]));
      break;
    }
  }
  return warnings;
}

// The text report of several --dir: each directory's table, then all of them together against
// the sum of the drives alone (directories on one drive counted once).
void print_striped(const std::vector<nvio::TuneResult>& results,
                   const nvio::StripedTuneResult& together, const std::vector<std::string>& drives,
                   const std::vector<std::string>& warnings) {
  for (const nvio::TuneResult& r : results) {
    print_table(r, "host memory");
    fmt::print("\n");
  }
  const std::set<std::string> distinct(drives.begin(), drives.end());
  const std::string all = distinct.size() == drives.size()
                              ? fmt::format("All {} drives", drives.size())
                              : fmt::format("All {} directories ({} drive{})", drives.size(),
                                            distinct.size(), distinct.size() == 1 ? "" : "s");
  fmt::print(
      "{} together: a {} file striped in {} stripes, each directory with its pick (median of "
      "3):\n",
      all, human_bytes(together.file_size), human_bytes(together.stripe_size));
  for (const nvio::StripedModeResult& m : together.modes) {
    // What the drives reached alone, each with its pick for this mode; directories on one drive
    // count once, at the best of them.
    std::map<std::string, double> best;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& pick = m.mode == nvio::TuneMode::Read ? results[i].read : results[i].write;
      if (pick) best[drives[i]] = std::max(best[drives[i]], pick->gbps);
    }
    double alone = 0;
    for (const auto& [drive, gbps] : best) alone += gbps;
    std::string per_dir;
    for (std::size_t d = 0; d < m.drive_gbps.size(); ++d) {
      per_dir +=
          fmt::format("{}{} {:.3f}", d ? ", " : "", together.directories[d], m.drive_gbps[d]);
    }
    const std::string of_what =
        distinct.size() == drives.size()
            ? std::string("the drives alone")
            : fmt::format("the {} distinct drive{} alone, directories on one drive counted once",
                          distinct.size(), distinct.size() == 1 ? "" : "s");
    fmt::print(
        "{:<6} {:7.3f} GB/s ({:.3f} GiB/s); {:.0f}% of the sum of {} ({:.3f} GB/s); per "
        "directory: {}\n",
        nvio::to_string(m.mode), m.gbps, m.gbps * 1e9 / (1 << 30),
        alone > 0 ? 100 * m.gbps / alone : 0.0, of_what, alone, per_dir);
  }
  for (const std::string& w : warnings) fmt::print("warning: {}\n", w);
  fmt::print(
      "(GB/s = 1e9 bytes/s. Below the sum: a slow drive holds the stripe back, or the "
      "drives share a bus, a controller or the CPUs; nvio bench --dir A --dir B shows "
      "each drive's share.)\n");
}

// Several --dir: each drive tuned alone, then all measured together on a striped file.
int run_tune_drives(const TuneArgs& args) {
  if (args.gpu) throw UsageError("--gpu tunes one --dir at a time");
  nvio::StripedTuneRequest striped;
  striped.directories = args.dirs;
  striped.stripe_size = nvio::parse_size(args.stripe_size.value_or("1M"), "--stripe-size");
  nvio::StripeLayout{striped.directories, striped.stripe_size}.validate();
  const std::string config = save_path(args);
  std::vector<nvio::TuneResult> results;
  nvio::TuneRequest first = make_tune_request(args, args.dirs.front());
  // 80 % of the budget is shared by the drives alone. The striped measurement is not a search and
  // is not held to the budget: three writes and reads of a --size file, which the user sized.
  const double share = first.settings.budget_s * 0.8 / static_cast<double>(args.dirs.size());
  std::vector<std::string> drives;
  for (const std::string& dir : args.dirs) {
    make_directory(dir);
    drives.push_back(drive_of(dir));
  }
  // Said before the minutes of measuring, and again with the results.
  const std::vector<std::string> warnings = shared_drive_warnings(args.dirs, drives);
  for (const std::string& w : warnings) std::fprintf(stderr, "nvio: warning: %s\n", w.c_str());
  // Ctrl-C: the library removes its scratch files (each drive's, the striped one) as it unwinds.
  const StopOnSignals stop;
  for (const std::string& dir : args.dirs) {
    nvio::TuneRequest req = make_tune_request(args, dir);
    req.settings.budget_s = share;
    ProgressLine progress;
    req.settings.progress = [&](const nvio::TuneProgress& p) { progress.update(p); };
    results.push_back(nvio::tune_directory(req));
  }
  for (const nvio::TuneResult& r : results) striped.options.push_back(r.recommended());
  striped.file_size = first.file_size;
  striped.modes = first.settings.modes;
  const nvio::StripedTuneResult together = nvio::measure_striped(striped);

  if (args.json) {
    json doc = {{"drives", json::array()},
                {"striped", json::parse(nvio::to_json(together))},
                {"drive_of_directory", drives},
                {"warnings", warnings}};
    for (const nvio::TuneResult& r : results)
      doc["drives"].push_back(json::parse(nvio::to_json(r)));
    fmt::print("{}\n", doc.dump(2));
  } else {
    print_striped(results, together, drives, warnings);
  }
  if (args.save) {
    std::set<std::string> keys;
    for (const nvio::TuneResult& r : results) {
      if (!keys.insert(r.device).second) {
        std::fprintf(stderr,
                     "nvio: note: %s is on device %s like an earlier --dir: one profile per "
                     "device, the last saved wins\n",
                     r.directory.c_str(), r.device.c_str());
      }
      save_result(r, config, args.json);
    }
  }
  return kExitOk;
}

}  // namespace

int run_tune(const TuneArgs& args) {
  if (args.dirs.size() > 1) return run_tune_drives(args);
  if (args.stripe_size) throw UsageError("--stripe-size needs several --dir");
  const std::string& dir = args.dirs.front();
  nvio::TuneRequest req = make_tune_request(args, dir);
  const int device = check_tune_gpu_flags(args);
  const std::string config = save_path(args);
  make_directory(dir);
  std::optional<nvio::DeviceBuffer> device_buffer;
  const std::string memory = attach_device_memory(args, device, req, device_buffer);

  ProgressLine progress;
  req.settings.progress = [&](const nvio::TuneProgress& p) { progress.update(p); };
  const StopOnSignals stop;  // Ctrl-C: the library removes its scratch file as it unwinds
  const nvio::TuneResult result = nvio::tune_directory(req);
  progress.clear();

  if (args.json) {
    fmt::print("{}\n", nvio::to_json(result));
  } else {
    print_table(result, memory);
  }
  if (args.save) save_result(result, config, args.json);
  return kExitOk;
}

}  // namespace nvio_cli
