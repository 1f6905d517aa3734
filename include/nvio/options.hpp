// Handle options: every option, its one default, and its NVIO_* environment override.
//
// Precedence, lowest to highest: the default below, then the saved configuration file written by
// `nvio tune --save` (see nvio/config.hpp), then the environment (NVIO_*), then values set
// explicitly by the caller (OptionOverrides). Environment and configuration values are parsed and
// range-checked strictly whenever options are resolved, whether or not a higher layer replaces
// them: a set NVIO_* variable that does not parse or is out of range raises InvalidArgument naming
// the variable, its value and the valid range, even when the caller passes an explicit value for
// that option or for another one (a malformed variable is a configuration mistake the user must
// hear about, not one that depends on which options a caller happens to set). The same holds for
// every value in the configuration file (see config.hpp). Explicit values are range-checked too.
//
// | option               | default | environment                 | valid range                  |
// |----------------------|---------|-----------------------------|------------------------------|
// | engine               | auto    | NVIO_ENGINE                 | auto, io_uring, libaio, psync|
// | block_size           | 1 MiB   | NVIO_BLOCK_SIZE             | 512 B .. 1 GiB (K/M/G ok)    |
// | queue_depth          | 128     | NVIO_QUEUE_DEPTH            | 1 .. 4096                    |
// | single_submit        | false   | NVIO_SINGLE_SUBMIT          | true/false/1/0/yes/no/on/off |
// | overlap_events       | true    | NVIO_OVERLAP_EVENTS         | as above                     |
// | intra_op_parallelism | 1       | NVIO_INTRA_OP_PARALLELISM   | 1 .. 256                     |
// | direct               | auto    | NVIO_DIRECT                 | auto, on, off                |
// | gpu_direct           | auto    | NVIO_GPU_DIRECT             | auto, on, off                |
//
// gpu_direct decides how device (CUDA) memory moves: auto uses GPUDirect Storage through cuFile
// only when it is real peer-to-peer (nvidia-fs or PCI P2PDMA), else the pipelined host bounce
// path; on uses cuFile even in its compatibility mode (and falls back to the bounce path, with one
// warning, when cuFile is missing or refuses the file); off always bounces. See gpu.hpp.
//
// overlap_events defaults to true here (keep the queue full, reap as completions arrive), which is
// the faster policy; DeepSpeed's aio_handle defaults it to false and nvio's DeepSpeed-compatible
// layer passes DeepSpeed's defaults explicitly.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace nvio {

enum class EngineKind { Auto, IoUring, Libaio, Psync };
enum class DirectIo { Auto, On, Off };
enum class GpuDirect { Auto, On, Off };

const char* to_string(EngineKind kind) noexcept;
const char* to_string(DirectIo mode) noexcept;
// Strict parsers: throw InvalidArgument naming `what` on anything unrecognised.
EngineKind parse_engine(const std::string& text, const std::string& what = "engine");
DirectIo parse_direct(const std::string& text, const std::string& what = "direct");
GpuDirect parse_gpu_direct(const std::string& text, const std::string& what = "gpu_direct");
const char* to_string(GpuDirect mode) noexcept;
bool parse_bool(const std::string& text, const std::string& what);
// Accepts plain bytes or a K/M/G/T suffix (powers of 1024, optional trailing "iB"/"B").
std::size_t parse_size(const std::string& text, const std::string& what);
std::size_t parse_count(const std::string& text, const std::string& what);

struct Options {
  EngineKind engine = EngineKind::Auto;
  std::size_t block_size = std::size_t{1} << 20;
  unsigned queue_depth = 128;
  bool single_submit = false;
  bool overlap_events = true;
  unsigned intra_op_parallelism = 1;
  DirectIo direct = DirectIo::Auto;
  GpuDirect gpu_direct = GpuDirect::Auto;

  // Throws InvalidArgument naming the first option out of range.
  void validate() const;
};

// Limits used by Options::validate(), exposed for bindings and the CLI.
inline constexpr std::size_t kMinBlockSize = 512;
inline constexpr std::size_t kMaxBlockSize = std::size_t{1} << 30;
inline constexpr unsigned kMaxQueueDepth = 4096;
inline constexpr unsigned kMaxParallelism = 256;

// Values the caller sets explicitly; unset fields fall through to the environment and defaults.
struct OptionOverrides {
  std::optional<EngineKind> engine;
  std::optional<std::size_t> block_size;
  std::optional<unsigned> queue_depth;
  std::optional<bool> single_submit;
  std::optional<bool> overlap_events;
  std::optional<unsigned> intra_op_parallelism;
  std::optional<DirectIo> direct;
  std::optional<GpuDirect> gpu_direct;
};

enum class OptionSource { Default, Config, Environment, Explicit };
const char* to_string(OptionSource source) noexcept;

struct EffectiveOptions {
  Options values;
  // Keyed by option name (as in the table above): where its value came from.
  std::map<std::string, OptionSource> sources;
  // The configuration file consulted (empty when disabled), whether it exists, and the profile
  // whose settings were applied (empty when none applied).
  std::string config_path;
  bool config_found = false;
  std::string config_profile;
  // Keyed by option name: the environment variable that overrides it.
  static const std::map<std::string, std::string>& environment_names();
};

// Reads the environment through `getenv` (defaults to std::getenv; tests pass their own).
using EnvLookup = std::function<const char*(const char*)>;

// Resolves defaults < configuration file < environment < overrides, validates the result, and
// records sources. `directory` picks the configuration profile of the file system that holds it;
// empty picks the profile saved last (the default one). Throws InvalidArgument for a malformed
// environment value or configuration file.
EffectiveOptions resolve_options(const OptionOverrides& overrides = {},
                                 const EnvLookup& getenv = {}, const std::string& directory = {});

}  // namespace nvio
