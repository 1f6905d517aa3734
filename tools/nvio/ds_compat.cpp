// `nvio ds-io` and `nvio ds-nvme-tune`: DeepSpeed's ds_io and ds_nvme_tune command lines, run by
// nvio bench and nvio tune.
//
// Each DeepSpeed flag becomes the nvio option it means (docs/deepnvme.md has the table); the
// measuring is bench's and tune's own. A DeepSpeed flag that nvio cannot honour is refused with
// the reason, and one that changes nothing in nvio is accepted with a note on stderr saying so.
// Figures are printed in nvio's units: GB = 1e9 bytes and GiB = 2^30 bytes, each labelled
// (ds_io and ds_nvme_tune print 2^30 bytes/s as "GB/sec").
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/json_excerpt.hpp"
#include "nvio/options.hpp"
#include "nvio/tune.hpp"

namespace nvio_cli {

namespace {

// ds_io's handle settings when a flag is not given (deepspeed/nvme/ds_aio_args.py): it always
// builds its handle with these, so ds-io does too rather than take nvio's defaults.
constexpr const char* kDsBlockSize = "1M";
constexpr const char* kDsQueueDepth = "32";
constexpr const char* kDsIoParallel = "1";

// DeepSpeed flags nvio has no counterpart for: the flag, whether it takes a value, and why.
struct Refused {
  const char* flag;
  bool takes_value;
  const char* reason;
};
constexpr Refused kDsIoRefused[] = {
    {"--slow_bounce_buffer", false,
     "nvio's GPU path has one bounce buffer, pipelined and locked once; there is no slow variant "
     "to measure"},
    {"--torch_legacy_save", false, "nvio moves bytes, not torch.save files"},
    {"--use_fast_io", false, "nvio moves bytes, not torch.save files (fast_io is a torch writer)"},
    {"--fast_io_size", true, "nvio moves bytes, not torch.save files (fast_io is a torch writer)"},
    {"--different_file_each_iteration", false,
     "nvio bench measures each process's one scratch file, laid out before the timed loops"},
};
// ds_io's --engine values other than its default, aio_handle (the handle nvio's is).
constexpr const char* kDsEngineRefused =
    "ds_io's other engines (aio_basic, torch_io, torch_fastio) are DeepSpeed and torch code paths; "
    "nvio ds-io measures nvio's handle, ds_io's aio_handle (nvio bench --engine chooses nvio's I/O "
    "engine)";

// Registers the refused flags so that each is named with its reason instead of CLI11's generic
// "not expected"; the first one given is raised by refuse_given.
template <std::size_t N>
void add_refused(CLI::App& app, const Refused (&table)[N], std::vector<std::string>& given) {
  for (const Refused& r : table) {
    const std::string flag = r.flag;
    const std::string help = std::string("Refused: ") + r.reason;
    if (r.takes_value) {
      app.add_option_function<std::string>(
             flag, [&given, flag](const std::string&) { given.push_back(flag); }, help)
          ->type_name("X");
    } else {
      app.add_flag_callback(
          flag, [&given, flag] { given.push_back(flag); }, help);
    }
  }
}

template <std::size_t N>
void refuse_given(const Refused (&table)[N], const std::vector<std::string>& given) {
  if (given.empty()) return;
  for (const Refused& r : table) {
    if (given.front() == r.flag) {
      throw UsageError(fmt::format("{}: not supported by nvio: {}", r.flag, r.reason));
    }
  }
}

void note(const std::string& text) { std::fprintf(stderr, "nvio: note: %s\n", text.c_str()); }

}  // namespace

void add_ds_io_options(CLI::App& app, DsIoArgs& args) {
  app.add_option("--folder", args.folder,
                 "Folder for the files (nvio bench --dir; each process gets its own scratch file)")
      ->type_name("DIR");
  app.add_option("--folder_to_device_mapping", args.folder_to_device_mapping,
                 "DIR:DEVICE ..., one process per entry (nvio bench --device-map)")
      ->type_name("DIR:N");
  app.add_option("--io_size", args.io_size,
                 "Bytes each process reads or writes per loop; K/M/G = 1024^n (nvio bench --size)")
      ->required()
      ->type_name("BYTES");
  app.add_flag("--read", args.read, "Read (nvio bench --op read); default: write (--op write)");
  app.add_option("--multi_process", args.multi_process,
                 "Processes doing I/O on --folder (nvio bench --procs)")
      ->type_name("N");
  app.add_option(
         "--block_size", args.block_size,
         fmt::format("Handle block size (nvio --block-size; default {}, as ds_io)", kDsBlockSize))
      ->type_name("BYTES");
  app.add_option("--queue_depth", args.queue_depth,
                 fmt::format("Handle queue depth (nvio --queue-depth; default {}, as ds_io)",
                             kDsQueueDepth))
      ->type_name("N");
  app.add_flag("--single_submit", args.single_submit,
               "Submit requests one at a time (nvio --single-submit)");
  app.add_flag("--sequential_requests", args.sequential_requests,
               "Do not overlap submission and completion (nvio --no-overlap-events; default "
               "overlap, as ds_io)");
  app.add_option(
         "--io_parallel", args.io_parallel,
         fmt::format("Per-operation parallelism (nvio --parallelism; default {})", kDsIoParallel))
      ->type_name("N");
  app.add_option("--loops", args.loops, "Timed loops (nvio bench --loops; default 3)")
      ->type_name("N");
  app.add_option("--warmup_loops", args.warmup_loops,
                 "Accepted with a note: nvio runs no warm-up loops and reports medians over "
                 "--loops instead")
      ->type_name("N");
  app.add_flag("--validate", args.validate,
               "Check every byte against the pattern written (nvio bench --verify)");
  app.add_flag("--gpu", args.gpu, "GPU memory (nvio bench --gpu)");
  app.add_flag("--use_gds", args.use_gds, "With --gpu: GPUDirect Storage (nvio bench --gds)");
  app.add_flag("--handle", args.handle,
               "Accepted: nvio always moves data through a handle (ds_io's aio_handle path)");
  app.add_flag("--use_accelerator_pin_memory", args.use_accelerator_pin_memory,
               "Accepted with a note: nvio locks its own host buffers");
  app.add_option("--engine", args.engine,
                 "aio_handle (ds_io's default and ds_nvme_tune's, the handle nvio's is); other "
                 "engines are refused")
      ->type_name("ENGINE");
  app.add_flag("--include_warmup_time", args.include_warmup_time,
               "Accepted with a note: nvio runs no warm-up loops");
  app.add_flag("--json", args.json, "Print nvio bench's JSON instead of its table (nvio's flag)");
  add_refused(app, kDsIoRefused, args.refused);
}

int run_ds_io(const DsIoArgs& args) {
  refuse_given(kDsIoRefused, args.refused);
  if (args.engine && *args.engine != "aio_handle") {
    throw UsageError(
        fmt::format("--engine {}: not supported by nvio: {}", *args.engine, kDsEngineRefused));
  }
  const bool mapped = !args.folder_to_device_mapping.empty();
  if (args.folder && mapped) {
    throw UsageError("--folder and --folder_to_device_mapping exclude each other (as in ds_io)");
  }
  if (!args.folder && !mapped) {
    throw UsageError("ds-io: --folder or --folder_to_device_mapping is required");
  }
  if (mapped && args.multi_process) {
    throw UsageError(
        "--multi_process: with --folder_to_device_mapping each entry is one process; give one or "
        "the other");
  }
  if (args.use_gds && !args.gpu) throw UsageError("--use_gds needs --gpu (as in ds_io)");

  // Checked here in ds_io's words: bench's own checks would name --size and --procs, flags the user
  // did not type.
  if (args.io_size && nvio::parse_size(*args.io_size, "--io_size") == 0) {
    throw UsageError("--io_size: must be at least 1 byte");
  }
  if (args.multi_process) {
    const std::size_t n = nvio::parse_count(*args.multi_process, "--multi_process");
    if (n == 0 || n > kMaxProcs) {
      throw UsageError(fmt::format("--multi_process: expected 1 to {} processes, got {}", kMaxProcs,
                                   *args.multi_process));
    }
  }
  BenchArgs b;
  if (args.folder) b.dirs = {*args.folder};
  b.device_map = args.folder_to_device_mapping;
  b.procs = args.multi_process;
  b.size = args.io_size;
  b.op = args.read ? "read" : "write";
  if (args.loops) b.loops = *args.loops;
  b.verify = args.validate;
  b.gpu = args.gpu;
  b.gds = args.use_gds;
  b.json = args.json;
  b.options["block_size"] = {"--block_size", args.block_size.value_or(kDsBlockSize)};
  b.options["queue_depth"] = {"--queue_depth", args.queue_depth.value_or(kDsQueueDepth)};
  b.options["intra_op_parallelism"] = {"--io_parallel", args.io_parallel.value_or(kDsIoParallel)};
  b.options["single_submit"] = {"--single_submit", args.single_submit ? "true" : "false"};
  b.options["overlap_events"] = {"--sequential_requests",
                                 args.sequential_requests ? "false" : "true"};

  if (args.warmup_loops) {
    nvio::parse_count(*args.warmup_loops, "--warmup_loops");
    note(
        fmt::format("--warmup_loops {}: no warm-up loops are run; nvio bench reports the median "
                    "of --loops timed loops, which one slow first loop does not move",
                    *args.warmup_loops));
  }
  if (args.include_warmup_time) {
    note("--include_warmup_time: no warm-up loops are run, so there is no warm-up time to include");
  }
  if (args.use_accelerator_pin_memory) {
    note(
        "--use_accelerator_pin_memory: nvio locks (mlock) and registers its own host buffers; "
        "the flag changes nothing");
  }
  const int code = run_bench(b);
  if (!args.json) {
    fmt::print(
        "(ds_io prints 2^30 bytes/s as \"GB/sec\": compare its figures with the GiB/s column)\n");
  }
  return code;
}

void add_ds_nvme_tune_options(CLI::App& app, DsTuneArgs& args) {
  app.add_option("--nvme_dir", args.nvme_dir,
                 "Directory on the NVMe drive to tune (nvio tune --dir); one directory")
      ->required()
      ->type_name("DIR");
  app.add_option("--sweep_config", args.sweep_config,
                 "ds_nvme_tune's sweep JSON: lists of block_size, queue_depth, io_parallel, "
                 "single_submit, sequential_requests; every combination is measured (nvio tune "
                 "--grid over that space)")
      ->type_name("FILE");
  auto* no_read = app.add_flag("--no_read", args.no_read, "Tune writes only (nvio --write-only)");
  auto* no_write = app.add_flag("--no_write", args.no_write, "Tune reads only (nvio --read-only)");
  no_read->excludes(no_write);
  app.add_option("--io_size", args.io_size,
                 "Bytes per measurement (nvio tune --trial-size; the file is this or 16 MiB, "
                 "whichever is larger)")
      ->type_name("BYTES")
      ->capture_default_str();
  app.add_flag("--flush_page_cache", args.flush_page_cache,
               "Accepted with a note: nvio evicts the page cache before every read trial itself");
  app.add_option("--log_dir", args.log_dir,
                 "Write the whole result (nvio tune --json) to LOG_DIR/nvio_tune.json")
      ->type_name("DIR");
  app.add_option("--loops", args.loops,
                 "Accepted with a note: nvio measures each configuration once and repeats the "
                 "leading ones")
      ->type_name("N");
  app.add_flag("--verbose", args.verbose, "Also print every measured configuration");
  app.add_flag("--json", args.json, "Print nvio tune's JSON document (nvio's flag)");
  app.add_flag("--gpu", args.gpu,
               "Trials move GPU memory through the host bounce path (nvio tune --gpu; device 0)");
  app.add_flag("--gds", args.gds,
               "With --gpu: GPUDirect Storage too (nvio tune --gds; use_gds in the aio block "
               "follows the pick)");
}

namespace {

// ds_nvme_tune's space without --sweep_config (perf_run_sweep.py's DEFAULT_SWEEP_CONFIG), with
// nvio's engines and direct modes.
nvio::TuneSpace ds_default_space() {
  nvio::TuneSpace s = nvio::TuneSpace::defaults();
  s.block_sizes = {std::size_t{1} << 20, std::size_t{8} << 20};
  s.queue_depths = {32, 128};
  s.parallelism = {1, 8};
  s.single_submit = {false};
  s.overlap_events = {true};
  return s;
}

template <typename T, typename Parse>
std::vector<T> list_of(const nlohmann::json& doc, const std::string& key, const std::string& path,
                       Parse parse) {
  const nlohmann::json& v = doc.at(key);
  if (!v.is_array() || v.empty()) {
    throw UsageError(fmt::format("--sweep_config {}: \"{}\" must be a non-empty list", path, key));
  }
  std::vector<T> out;
  for (const nlohmann::json& item : v) out.push_back(parse(item, key));
  return out;
}

// The sweep file of ds_nvme_tune as an nvio tune space: its dimensions, with nvio's engines and
// direct modes (DeepSpeed has one of each: libaio, O_DIRECT).
nvio::TuneSpace read_sweep_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("--sweep_config {}: cannot be read", path));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {  // out_of_range too, for a number like 1e400
    throw UsageError(fmt::format("--sweep_config {}: not valid JSON ({})", path, e.what()));
  }
  if (!doc.is_object()) throw UsageError(fmt::format("--sweep_config {}: not a JSON object", path));
  const auto size = [&path](const nlohmann::json& v, const std::string& key) -> std::size_t {
    if (v.is_string()) return nvio::parse_size(v.get<std::string>(), "--sweep_config " + key);
    if (v.is_number_unsigned()) return v.get<std::size_t>();
    throw UsageError(fmt::format("--sweep_config {}: \"{}\" holds {}, not a size", path, key,
                                 nvio::json_excerpt(v)));
  };
  const auto count = [&path](const nlohmann::json& v, const std::string& key) -> unsigned {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > 0 &&
        v.get<std::uint64_t>() <= 1u << 20) {
      return v.get<unsigned>();
    }
    throw UsageError(fmt::format("--sweep_config {}: \"{}\" holds {}, not a count", path, key,
                                 nvio::json_excerpt(v)));
  };
  const auto boolean = [&path](const nlohmann::json& v, const std::string& key) -> bool {
    if (v.is_boolean()) return v.get<bool>();
    throw UsageError(fmt::format("--sweep_config {}: \"{}\" holds {}, not true or false", path, key,
                                 nvio::json_excerpt(v)));
  };
  nvio::TuneSpace s = ds_default_space();
  // A key the file leaves out is held at ds_io's default, as ds_io runs without its flag.
  s.block_sizes = {std::size_t{1} << 20};
  s.queue_depths = {32};
  s.parallelism = {1};
  for (const auto& [key, value] : doc.items()) {
    if (key == "block_size") {
      s.block_sizes = list_of<std::size_t>(doc, key, path, size);
    } else if (key == "queue_depth") {
      s.queue_depths = list_of<unsigned>(doc, key, path, count);
    } else if (key == "io_parallel") {
      s.parallelism = list_of<unsigned>(doc, key, path, count);
    } else if (key == "single_submit") {
      s.single_submit = list_of<bool>(doc, key, path, boolean);
    } else if (key == "sequential_requests") {
      s.overlap_events.clear();
      for (bool sequential : list_of<bool>(doc, key, path, boolean)) {
        s.overlap_events.push_back(!sequential);
      }
    } else {
      throw UsageError(
          fmt::format("--sweep_config {}: unknown key \"{}\" (nvio reads block_size, queue_depth, "
                      "io_parallel, single_submit, sequential_requests)",
                      path, key));
    }
  }
  return s;
}

std::string gb_text(double gbps) {
  return fmt::format("{:.3f} GB/s ({:.3f} GiB/s)", gbps, gbps * 1e9 / (1024.0 * 1024 * 1024));
}

std::string pick_text(const nvio::Options& o) {
  return fmt::format(
      "engine {}, block_size {}, queue_depth {}, intra_op_parallelism {}, single_submit {}, "
      "overlap_events {}, direct {}",
      nvio::to_string(o.engine), human_bytes(o.block_size), o.queue_depth, o.intra_op_parallelism,
      o.single_submit, o.overlap_events, nvio::to_string(o.direct));
}

}  // namespace

int run_ds_nvme_tune(const DsTuneArgs& args) {
  if (args.nvme_dir.size() != 1) {
    throw UsageError(fmt::format(
        "--nvme_dir: nvio tunes one directory (one drive) at a time, got {}; run ds-nvme-tune "
        "once per directory",
        args.nvme_dir.size()));
  }
  const std::size_t io_size = nvio::parse_size(args.io_size, "--io_size");
  if (io_size < kMinTrialBytes) {  // 0 became 16 MiB without a word
    throw UsageError(
        fmt::format("--io_size: {} is below 1 MiB, too little to time each trial", args.io_size));
  }
  TuneArgs t;
  t.dirs = {args.nvme_dir.front()};
  t.size = std::to_string(std::max<std::size_t>(io_size, std::size_t{16} << 20));
  t.trial_size = std::to_string(io_size);
  t.grid = true;
  t.read_only = args.no_write;
  t.write_only = args.no_read;
  t.gpu = args.gpu;
  t.gds = args.gds;
  nvio::TuneRequest req = make_tune_request(t, t.dirs.front());
  req.space = args.sweep_config ? read_sweep_config(*args.sweep_config) : ds_default_space();
  const int device = check_tune_gpu_flags(t);
  std::optional<nvio::DeviceBuffer> device_buffer;
  const std::string memory = attach_device_memory(t, device, req, device_buffer);
  if (args.loops) {
    nvio::parse_count(*args.loops, "--loops");
    note(
        fmt::format("--loops {}: nvio measures each configuration once and repeats the leading "
                    "ones (the confirm phase of nvio tune)",
                    *args.loops));
  }
  if (args.flush_page_cache) {
    note(
        "--flush_page_cache: nvio evicts each read trial's range from the page cache itself "
        "(posix_fadvise, no sudo) and also measures O_DIRECT");
  }
  if (args.log_dir) std::filesystem::create_directories(*args.log_dir);

  const StopOnSignals stop;  // Ctrl-C: the library removes its scratch file as it unwinds
  const nvio::TuneResult result = nvio::tune_directory(req);
  nlohmann::json doc = nlohmann::json::parse(nvio::to_json(result));
  // DeepSpeed's use_gds: whether the pick moves device memory through cuFile (never for host
  // memory, whose handle is the aio one).
  if (doc["deepspeed"].is_object()) {
    doc["deepspeed"]["aio"]["use_gds"] = result.recommended().gpu_direct == nvio::GpuDirect::On;
  }
  std::string log_path;
  if (args.log_dir) {
    log_path = (std::filesystem::path(*args.log_dir) / "nvio_tune.json").string();
    std::ofstream out(log_path);
    out << doc.dump(2) << "\n";
    if (!out) throw nvio::Error(fmt::format("--log_dir: cannot write {}", log_path));
  }
  if (args.json) {
    fmt::print("{}\n", doc.dump(2));
    return kExitOk;
  }
  fmt::print(
      "nvio ds-nvme-tune: {} ({}, {}): {} configurations measured in {:.1f} s, {} ({} "
      "bytes) per trial of {}\n",
      result.directory, result.filesystem, result.device, result.points.size(), result.elapsed_s,
      human_bytes(result.trial_bytes), result.trial_bytes, memory);
  if (args.verbose) {
    for (const nvio::TunePoint& p : result.points) {
      fmt::print("  {:<5} {}  {}\n", nvio::to_string(p.mode), gb_text(p.median_gbps()),
                 pick_text(p.options));
    }
  }
  std::string best;
  for (const auto& [name, pick] :
       {std::pair{"read", result.read}, std::pair{"write", result.write}}) {
    if (!pick) continue;
    best += fmt::format("{}{} = {}", best.empty() ? "" : ", ", name, gb_text(pick->gbps));
  }
  fmt::print("Best performance: {}\n", best);
  fmt::print(
      "(GB = 1e9 bytes, GiB = 2^30 bytes; ds_nvme_tune prints 2^30 bytes/s as \"GB/sec\", so "
      "compare its figures with the GiB/s ones)\n");
  for (const auto& [name, pick] :
       {std::pair{"read", result.read}, std::pair{"write", result.write}}) {
    if (pick) fmt::print("{} pick: {}\n", name, pick_text(pick->options));
  }
  if (result.mixed) {
    fmt::print("mixed pick: {} (read {}, write {}; the harmonic mean is the best)\n",
               pick_text(result.mixed->options), gb_text(result.mixed->read_gbps),
               gb_text(result.mixed->write_gbps));
  }
  for (const std::string& w : result.warnings) fmt::print("note: {}\n", w);
  if (!log_path.empty()) fmt::print("result: {}\n", log_path);
  if (!doc["deepspeed"].is_object()) return kExitOk;
  fmt::print("DeepSpeed \"aio\" section ({} pick):\n{}\n", doc["recommended"].get<std::string>(),
             doc["deepspeed"].dump(2));
  return kExitOk;
}

}  // namespace nvio_cli
