// The tuner: finds the fastest handle options for a directory within a time budget.
//
// The search is separated from the measuring so that it can be tested on a simulated throughput
// surface: search() asks a Measurer for samples and a clock; tune_directory() supplies a real one
// that reads and writes a scratch file with nvio::Handle.
//
// Search (per mode, read and write, each with its share of the budget):
//   1. seeds: one point per engine x direct mode, at middling settings;
//   2. climb: from the best seeds, try the neighbours of the current point along each dimension
//      (block size and queue depth by factors of 4, then 2; parallelism by 2; booleans and the
//      engine and direct mode switched) and move when a neighbour beats it by more than the noise
//      measured so far; stop at a local optimum or when most of the share is spent;
//   3. confirm: successive halving over the best few points with repeated samples, so that the
//      pick is a median over repeats, not one lucky sample.
// With both modes, a final share measures the best points of each mode in the other, and the
// mixed pick maximises the harmonic mean of read and write throughput (equal bytes each way).
// Dimensions that an engine ignores (psync: queue depth, single_submit, overlap_events) are held
// at one value for it. With device memory (TuneRequest::device_memory), gpu_direct is a dimension
// too: off measures the pipelined host bounce path, on cuFile (GPUDirect Storage). cuFile moves
// each piece with one synchronous call on a worker, on the O_DIRECT descriptor, so for gpu_direct
// on the engine (the first of the space), direct (on), queue depth, single_submit and
// overlap_events are held at one value.
//
// Thread-safety: search() and tune_directory() run on the calling thread; the progress callback
// is called on it too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nvio/config.hpp"
#include "nvio/export.hpp"
#include "nvio/gpu.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

enum class TuneMode { Read, Write };
const char* to_string(TuneMode mode) noexcept;

// The space searched. Empty vectors are invalid (InvalidArgument).
struct TuneSpace {
  std::vector<EngineKind> engines;  // concrete engines only (no Auto)
  std::vector<std::size_t> block_sizes;
  std::vector<unsigned> queue_depths;
  std::vector<unsigned> parallelism;
  std::vector<bool> single_submit{false, true};
  std::vector<bool> overlap_events{false, true};
  std::vector<DirectIo> direct{DirectIo::On, DirectIo::Off};  // On / Off only
  // On / Off only; On needs device memory (it decides only how device memory moves).
  std::vector<GpuDirect> gpu_direct{GpuDirect::Off};

  // The documented default: available engines, 128 KiB..16 MiB, queue depth 1..256, parallelism
  // 1..2x the online CPUs (powers of two), both booleans, direct on and off, gpu_direct off.
  static TuneSpace defaults();
  void validate() const;
  // Every configuration in the space, with the dimensions an engine ignores held at one value.
  std::vector<Options> all() const;
};

struct TuneSample {
  double gbps = 0;         // bytes / elapsed seconds / 1e9
  double cpu_seconds = 0;  // process CPU time (user + system) spent by the trial
  double bytes = 0;
};

// What the search measures with. Real: tune_directory's file trials. Tests: a simulated surface.
class Measurer {
 public:
  virtual ~Measurer() = default;
  virtual TuneSample measure(const Options& options, TuneMode mode) = 0;
  // Seconds since the tuning started (the budget is counted against this clock).
  virtual double now() = 0;
};

// The median of a sample, as every figure the tuner reports and `nvio bench`'s are taken over
// repeats: the middle value, or the mean of the middle two for an even count; 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

struct TunePoint {
  TuneMode mode = TuneMode::Read;
  Options options;
  std::vector<TuneSample> samples;

  double median_gbps() const;
  // (max - min) / median over the samples; 0 with one sample.
  double spread() const;
  double cpu_seconds_per_gb() const;
};

struct TunePick {
  Options options;
  double gbps = 0;    // median
  double spread = 0;  // over its repeats
  std::size_t repeats = 0;
  double cpu_seconds_per_gb = 0;
  double runner_up_gbps = 0;  // the best other point's median (0 when none)
};

struct MixedPick {
  Options options;
  double read_gbps = 0;
  double write_gbps = 0;
  double mixed_gbps = 0;  // harmonic mean of the two
};

enum class TuneStrategy { Search, Grid };
const char* to_string(TuneStrategy strategy) noexcept;

struct TuneProgress {
  double elapsed_s = 0;
  double budget_s = 0;
  TuneMode mode = TuneMode::Read;
  std::string phase;  // "seed", "climb", "confirm", "cross", "grid"
  std::size_t points = 0;
  std::optional<TunePick> best;  // best so far in `mode`
};

struct TuneSettings {
  TuneStrategy strategy = TuneStrategy::Search;
  double budget_s = 60;  // ignored by Grid
  std::vector<TuneMode> modes{TuneMode::Read, TuneMode::Write};
  std::function<void(const TuneProgress&)> progress;  // optional
};

struct TuneResult {
  TuneStrategy strategy = TuneStrategy::Search;
  double budget_s = 0;
  double elapsed_s = 0;
  std::vector<TuneMode> modes;
  std::vector<TunePoint> points;
  std::optional<TunePick> read;
  std::optional<TunePick> write;
  std::optional<MixedPick> mixed;
  // Filled by tune_directory.
  std::string directory;
  std::string device;  // profile key, "dev:MAJOR:MINOR"
  std::string filesystem;
  std::uint64_t file_size = 0;
  std::uint64_t trial_bytes = 0;
  std::vector<std::string> warnings;
  // Device when the trials moved device memory (then the options carry gpu_direct).
  MemoryKind memory = MemoryKind::Host;
  // Set by search(): gpu_direct took more than one value, so the pick's gpu_direct is a finding
  // (saved with the profile); with one value it was a given, and the profile leaves it alone.
  bool gpu_direct_searched = false;

  // The options to save and use by default: mixed when both modes ran, else the one measured.
  Options recommended() const;
};

// The result as a JSON document (the format `nvio tune --json` prints and nvio.tune() returns):
// every measured point with its samples, the picks, and DeepSpeed's "aio" section for the
// recommended options.
std::string to_json(const TuneResult& result, int indent = 2);

// The configuration profile that saves result.recommended() for result.device (see config.hpp).
ConfigProfile to_profile(const TuneResult& result);

// Runs the search (or the grid) against `measurer`. Throws InvalidArgument for a bad space or
// settings; exceptions from the measurer propagate.
TuneResult search(const TuneSpace& space, Measurer& measurer, const TuneSettings& settings);

// Device memory the trials move instead of host memory (`nvio tune --gpu`). The caller owns it
// (DeviceBuffer; tests: a fake device) and keeps it alive while tuning.
struct TuneDeviceMemory {
  void* data = nullptr;
  std::size_t size = 0;  // at least the trial size; an automatic trial size is capped at it
};

struct TuneRequest {
  std::string directory;
  std::uint64_t file_size = std::uint64_t{1} << 30;
  // Bytes per trial; 0 picks about a quarter second's worth at the speed the file was written,
  // at most max_auto_trial_bytes(file_size).
  std::uint64_t trial_bytes = 0;
  TuneSpace space = TuneSpace::defaults();
  TuneSettings settings;
  bool keep_file = false;
  std::optional<TuneDeviceMemory> device_memory;
};

// The largest trial an automatic trial size picks for a file of `file_size` bytes: the device
// memory that `nvio tune --gpu` allocates when no trial size is given.
std::uint64_t max_auto_trial_bytes(std::uint64_t file_size) noexcept;

// Creates a scratch file of request.file_size in request.directory (removed afterwards unless
// keep_file), then runs search() with trials that read or write it. Each write trial ends with
// fdatasync (so write-back caching cannot flatter it); a buffered read trial first evicts its
// range from the page cache (posix_fadvise). With device_memory, the trials read into and write
// from it as MemoryKind::Device; it is first filled from the file (untimed), so writes carry the
// file's pattern. Throws IoError / NoSpace for the directory, InvalidArgument for gpu_direct on
// without device memory or a trial larger than it, GpuError from the device path.
TuneResult tune_directory(const TuneRequest& request);

// Several drives together: a file of `file_size` bytes striped over `directories` (see
// nvio/stripe.hpp), drive i with options[i] (what tune_directory picked for it), written (with
// fdatasync) and read `repeats` times in each of `modes`, each drive's share timed too. The file
// moves in chunks of at most chunk_bytes (whole rows of stripes) through one buffer, the first read
// pass checks every byte, and the file is removed afterwards. What `nvio tune --dir A --dir B`
// reports after tuning each drive alone, so that the aggregate and what limits it (one slow drive,
// the CPUs) are measured, not assumed.
struct StripedTuneRequest {
  std::vector<std::string> directories;
  std::vector<Options> options;  // one per directory
  std::size_t stripe_size = std::size_t{1} << 20;
  std::uint64_t file_size = std::uint64_t{1} << 30;
  std::vector<TuneMode> modes{TuneMode::Read, TuneMode::Write};
  unsigned repeats = 3;
  // The most bytes moved per call (rounded down to whole rows of stripes, at least one row).
  std::uint64_t chunk_bytes = std::uint64_t{256} << 20;
};
struct StripedModeResult {
  TuneMode mode = TuneMode::Read;
  double gbps = 0;                 // aggregate: bytes / seconds until the last drive finished
  std::vector<double> all_gbps;    // each repeat's aggregate
  std::vector<double> drive_gbps;  // per drive: its bytes / seconds until its last byte (median)
};
struct StripedTuneResult {
  std::vector<std::string> directories;
  std::size_t stripe_size = 0;
  std::uint64_t file_size = 0;
  std::vector<StripedModeResult> modes;
};
// Throws as StripedHandle does (a missing directory, NoSpace, ...).
StripedTuneResult measure_striped(const StripedTuneRequest& request);
// {"directories", "stripe_size", "file_size", "modes": [{"mode", "gb_per_s", "gb_per_s_all",
// "drive_gb_per_s"}]}
std::string to_json(const StripedTuneResult& result, int indent = 2);

}  // namespace nvio
NVIO_API_END
