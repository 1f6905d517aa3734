#include "nvio/options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include "nvio/config.hpp"
#include "nvio/errors.hpp"

namespace nvio {

const char* to_string(EngineKind kind) noexcept {
  switch (kind) {
    case EngineKind::Auto: return "auto";
    case EngineKind::IoUring: return "io_uring";
    case EngineKind::Libaio: return "libaio";
    case EngineKind::Psync: return "psync";
  }
  return "?";
}

const char* to_string(DirectIo mode) noexcept {
  switch (mode) {
    case DirectIo::Auto: return "auto";
    case DirectIo::On: return "on";
    case DirectIo::Off: return "off";
  }
  return "?";
}

const char* to_string(OptionSource source) noexcept {
  switch (source) {
    case OptionSource::Default: return "default";
    case OptionSource::Config: return "config";
    case OptionSource::Environment: return "environment";
    case OptionSource::Explicit: return "explicit";
  }
  return "?";
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

[[noreturn]] void reject(const std::string& what, const std::string& text,
                         const std::string& expected) {
  throw InvalidArgument(
      fmt::format("invalid value '{}' for {}: expected {}", text, what, expected));
}

}  // namespace

EngineKind parse_engine(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return EngineKind::Auto;
  if (t == "io_uring" || t == "iouring" || t == "uring") return EngineKind::IoUring;
  if (t == "libaio" || t == "aio") return EngineKind::Libaio;
  if (t == "psync") return EngineKind::Psync;
  reject(what, text, "auto, io_uring, libaio or psync");
}

DirectIo parse_direct(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return DirectIo::Auto;
  if (t == "on" || t == "true" || t == "1" || t == "yes") return DirectIo::On;
  if (t == "off" || t == "false" || t == "0" || t == "no") return DirectIo::Off;
  reject(what, text, "auto, on or off");
}

const char* to_string(GpuDirect mode) noexcept {
  switch (mode) {
    case GpuDirect::Auto: return "auto";
    case GpuDirect::On: return "on";
    case GpuDirect::Off: return "off";
  }
  return "?";
}

GpuDirect parse_gpu_direct(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return GpuDirect::Auto;
  if (t == "on" || t == "true" || t == "1" || t == "yes") return GpuDirect::On;
  if (t == "off" || t == "false" || t == "0" || t == "no") return GpuDirect::Off;
  reject(what, text, "auto, on or off");
}

bool parse_bool(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  reject(what, text, "true/false, 1/0, yes/no or on/off");
}

std::size_t parse_count(const std::string& text, const std::string& what) {
  std::size_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    reject(what, text, "a non-negative integer");
  }
  return value;
}

std::size_t parse_size(const std::string& text, const std::string& what) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  std::size_t value = 0;
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec != std::errc() || ptr == begin) {
    reject(what, text, "a size in bytes, optionally with a K, M, G or T suffix");
  }
  static const std::map<std::string, unsigned> kShifts = {
      {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
      {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40}};
  const auto it = kShifts.find(lower(std::string(ptr, end)));
  if (it == kShifts.end()) {
    reject(what, text, "a size in bytes, optionally with a K, M, G or T suffix");
  }
  const unsigned shift = it->second;
  if (shift > 0 && value > (std::numeric_limits<std::size_t>::max() >> shift)) {
    reject(what, text, "a size that fits in 64 bits");
  }
  return value << shift;
}

void Options::validate() const {
  if (block_size < kMinBlockSize || block_size > kMaxBlockSize) {
    throw InvalidArgument(fmt::format("block_size must be between {} and {} bytes, got {}",
                                      kMinBlockSize, kMaxBlockSize, block_size));
  }
  if (queue_depth < 1 || queue_depth > kMaxQueueDepth) {
    throw InvalidArgument(
        fmt::format("queue_depth must be between 1 and {}, got {}", kMaxQueueDepth, queue_depth));
  }
  if (intra_op_parallelism < 1 || intra_op_parallelism > kMaxParallelism) {
    throw InvalidArgument(fmt::format("intra_op_parallelism must be between 1 and {}, got {}",
                                      kMaxParallelism, intra_op_parallelism));
  }
}

const std::map<std::string, std::string>& EffectiveOptions::environment_names() {
  static const std::map<std::string, std::string> names = {
      {"engine", "NVIO_ENGINE"},
      {"block_size", "NVIO_BLOCK_SIZE"},
      {"queue_depth", "NVIO_QUEUE_DEPTH"},
      {"single_submit", "NVIO_SINGLE_SUBMIT"},
      {"overlap_events", "NVIO_OVERLAP_EVENTS"},
      {"intra_op_parallelism", "NVIO_INTRA_OP_PARALLELISM"},
      {"direct", "NVIO_DIRECT"},
      {"gpu_direct", "NVIO_GPU_DIRECT"},
  };
  return names;
}

namespace {

unsigned parse_unsigned(const std::string& text, const std::string& what) {
  const std::size_t v = parse_count(text, what);
  if (v > std::numeric_limits<unsigned>::max()) {
    reject(what, text, "an integer that fits in 32 bits");
  }
  return static_cast<unsigned>(v);
}

// Applies one option from each layer in turn; `parse` turns the environment text into a value.
template <typename T, typename Parse>
void layer(const char* name, T Options::*field, Options& values,
           const std::optional<T>& config_value, const std::optional<T>& explicit_value,
           const EnvLookup& getenv, EffectiveOptions& out, Parse parse) {
  out.sources[name] = OptionSource::Default;
  if (config_value) {
    values.*field = *config_value;
    out.sources[name] = OptionSource::Config;
  }
  const std::string& var = EffectiveOptions::environment_names().at(name);
  if (const char* text = getenv(var.c_str()); text != nullptr) {
    const T parsed = parse(std::string(text), var);
    // Range-checked here, not only in the merged result: a bad variable is a mistake the user
    // must hear about even when an explicit value replaces it.
    Options probe;
    probe.*field = parsed;
    try {
      probe.validate();
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("invalid value '{}' for {}: {}", text, var, e.what()));
    }
    values.*field = parsed;
    out.sources[name] = OptionSource::Environment;
  }
  if (explicit_value) {
    values.*field = *explicit_value;
    out.sources[name] = OptionSource::Explicit;
  }
}

}  // namespace

EffectiveOptions resolve_options(const OptionOverrides& overrides, const EnvLookup& getenv_fn,
                                 const std::string& directory) {
  const EnvLookup getenv = getenv_fn ? getenv_fn : [](const char* n) { return std::getenv(n); };
  EffectiveOptions out;
  out.config_path = config_path(getenv);
  OptionOverrides saved;
  if (const std::optional<ConfigFile> file = load_config(out.config_path)) {
    out.config_found = true;
    if (const std::optional<ConfigProfile> profile = select_profile(*file, directory)) {
      out.config_profile = profile->key;
      saved = profile->options;
    }
  }
  Options& o = out.values;
  const OptionOverrides& x = overrides;
  layer("engine", &Options::engine, o, saved.engine, x.engine, getenv, out, parse_engine);
  layer("block_size", &Options::block_size, o, saved.block_size, x.block_size, getenv, out,
        parse_size);
  layer("queue_depth", &Options::queue_depth, o, saved.queue_depth, x.queue_depth, getenv, out,
        parse_unsigned);
  layer("single_submit", &Options::single_submit, o, saved.single_submit, x.single_submit, getenv,
        out, parse_bool);
  layer("overlap_events", &Options::overlap_events, o, saved.overlap_events, x.overlap_events,
        getenv, out, parse_bool);
  layer("intra_op_parallelism", &Options::intra_op_parallelism, o, saved.intra_op_parallelism,
        x.intra_op_parallelism, getenv, out, parse_unsigned);
  layer("direct", &Options::direct, o, saved.direct, x.direct, getenv, out, parse_direct);
  layer("gpu_direct", &Options::gpu_direct, o, saved.gpu_direct, x.gpu_direct, getenv, out,
        parse_gpu_direct);
  // The configuration file and the environment were range-checked as they were read, so only an
  // explicit value can still be out of range here; the message names the option.
  o.validate();
  return out;
}

}  // namespace nvio
