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
// Every option is one row of the option table (option_specs() below, defined in options.cpp): its
// name, NVIO_* variable, type, valid range and description. Defaults are the member initialisers
// of Options. The environment, the configuration file, the JSON and Python renderings, the
// binding's keyword arguments and the command line's flags all walk that table, so an option is
// added in three places only: a member of Options, one of OptionOverrides, and a row (the Python
// binding exposes the rows as _nvio.option_specs()).
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
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// The engine of a handle's options: Auto, IoUring, Libaio or Psync. CuFile (GPUDirect Storage)
// is an engine kind too but never the handle's: device memory goes through it when gpu_direct
// picks it (Options::validate refuses it as `engine`, parse_engine does not accept it).
enum class EngineKind { Auto, IoUring, Libaio, Psync, CuFile };
enum class DirectIo { Auto, On, Off };
enum class GpuDirect { Auto, On, Off };
enum class CachedReads { Auto, Off };

const char* to_string(EngineKind kind) noexcept;
const char* to_string(DirectIo mode) noexcept;
// Strict parsers: throw InvalidArgument naming `what` on anything unrecognised.
EngineKind parse_engine(const std::string& text, const std::string& what = "engine");
DirectIo parse_direct(const std::string& text, const std::string& what = "direct");
GpuDirect parse_gpu_direct(const std::string& text, const std::string& what = "gpu_direct");
const char* to_string(GpuDirect mode) noexcept;
CachedReads parse_cached_reads(const std::string& text, const std::string& what = "cached_reads");
const char* to_string(CachedReads mode) noexcept;
bool parse_bool(const std::string& text, const std::string& what);
// Accepts plain bytes or a K/M/G/T suffix (powers of 1024, optional trailing "iB"/"B").
std::size_t parse_size(const std::string& text, const std::string& what);
std::size_t parse_count(const std::string& text, const std::string& what);

namespace detail {
struct NVIO_LOCAL OptionAccess;
}

// A value of any option in its typed form, as JSON, Python and the configuration file hold it: a
// boolean, an integer (sizes in bytes, counts) or the name of a choice ("io_uring", "on").
using OptionValue = std::variant<bool, std::int64_t, std::string>;

enum class OptionType { Boolean, Integer, Choice };
const char* to_string(OptionType type) noexcept;

// One row of the option table. Static storage, immutable: safe to read from any thread.
struct OptionSpec {
  const char* name;         // "queue_depth": the key in JSON, Python and the configuration file
  const char* environment;  // "NVIO_QUEUE_DEPTH"
  OptionType type;
  std::int64_t min;  // Integer: the valid range, inclusive (0 for other types)
  std::int64_t max;
  const char* unit;      // Integer: "bytes" for a size (text may carry K/M/G/T), else ""
  const char* accepted;  // the values accepted, in words ("auto, on or off")
  const char* description;
  const detail::OptionAccess* access;  // how the row reaches its members (options.cpp)
};

// The option table, in the order options are listed everywhere.
std::span<const OptionSpec> option_specs() noexcept;
// The row called `name`, or nullptr.
const OptionSpec* find_option(std::string_view name) noexcept;
// The row called `name`; throws InvalidArgument naming the known options when there is none.
const OptionSpec& option_spec(std::string_view name);
// Throws the InvalidArgument for a value of the wrong type for `spec` (shown as `shown`, from
// `what`), for readers whose values cannot become an OptionValue (a JSON float or null).
[[noreturn]] void reject_option_type(const OptionSpec& spec, const std::string& shown,
                                     const std::string& what);

struct Options {
  EngineKind engine = EngineKind::Auto;
  std::size_t block_size = std::size_t{1} << 20;
  unsigned queue_depth = 128;
  bool single_submit = false;
  bool overlap_events = true;
  unsigned intra_op_parallelism = 1;
  DirectIo direct = DirectIo::Auto;
  GpuDirect gpu_direct = GpuDirect::Auto;
  CachedReads cached_reads = CachedReads::Auto;

  // Throws InvalidArgument (option() names it) for the first option out of range.
  void validate() const;
  // The value of option `name` in its typed form. Throws InvalidArgument for an unknown name.
  OptionValue get(std::string_view name) const;
};

// Limits used by Options::validate() through the option table, exposed for the tuner and tests.
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
  std::optional<CachedReads> cached_reads;

  // Sets option `name` from text as an NVIO_* variable or a command-line flag spells it ("64K",
  // "on", "io_uring"), strictly: a value that does not parse or is out of range throws
  // InvalidArgument whose option() is `name` and whose message names `what` (the variable, flag or
  // key the text came from; the option's name when empty) and the accepted values.
  void set_text(std::string_view name, const std::string& text, const std::string& what = {});
  // Sets option `name` from its typed form (JSON, Python): a boolean option takes only a boolean,
  // an integer one an integer (block_size also a size text such as "2M"), a choice a string.
  // Throws as set_text does, also for a value of the wrong type.
  void set_value(std::string_view name, const OptionValue& value, const std::string& what = {});
  // The value set for option `name`, or nullopt. Throws InvalidArgument for an unknown name.
  std::optional<OptionValue> get(std::string_view name) const;
};

enum class OptionSource { Default, Config, Environment, Explicit };
const char* to_string(OptionSource source) noexcept;

struct EffectiveOptions {
  Options values;
  // Keyed by option name: where its value came from.
  std::map<std::string, OptionSource> sources;
  // The configuration file consulted (empty when disabled), whether it exists, and the profile
  // whose settings were applied (empty when none applied).
  std::string config_path;
  bool config_found = false;
  std::string config_profile;
  // Keyed by option name: the environment variable that overrides it (from the option table).
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
NVIO_API_END
