#include "nvio/options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <type_traits>

#include "nvio/config.hpp"
#include "nvio/errors.hpp"

namespace nvio {

const char* to_string(EngineKind kind) noexcept {
  switch (kind) {
    case EngineKind::Auto: return "auto";
    case EngineKind::IoUring: return "io_uring";
    case EngineKind::Libaio: return "libaio";
    case EngineKind::Psync: return "psync";
    case EngineKind::CuFile: return "cuFile";
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

// The accepted values in words: in the parsers' messages and in the option table.
constexpr const char* kEngineWords = "auto, io_uring, libaio or psync";
constexpr const char* kModeWords = "auto, on or off";
constexpr const char* kCachedWords = "auto or off";
constexpr const char* kBoolWords = "true/false, 1/0, yes/no or on/off";

}  // namespace

EngineKind parse_engine(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return EngineKind::Auto;
  if (t == "io_uring" || t == "iouring" || t == "uring") return EngineKind::IoUring;
  if (t == "libaio" || t == "aio") return EngineKind::Libaio;
  if (t == "psync") return EngineKind::Psync;
  reject(what, text, kEngineWords);
}

DirectIo parse_direct(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return DirectIo::Auto;
  if (t == "on" || t == "true" || t == "1" || t == "yes") return DirectIo::On;
  if (t == "off" || t == "false" || t == "0" || t == "no") return DirectIo::Off;
  reject(what, text, kModeWords);
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
  reject(what, text, kModeWords);
}

const char* to_string(CachedReads mode) noexcept {
  switch (mode) {
    case CachedReads::Auto: return "auto";
    case CachedReads::Off: return "off";
  }
  return "?";
}

CachedReads parse_cached_reads(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "auto") return CachedReads::Auto;
  if (t == "off" || t == "false" || t == "0" || t == "no") return CachedReads::Off;
  reject(what, text, kCachedWords);
}

bool parse_bool(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  reject(what, text, kBoolWords);
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

const char* to_string(OptionType type) noexcept {
  switch (type) {
    case OptionType::Boolean: return "boolean";
    case OptionType::Integer: return "integer";
    case OptionType::Choice: return "choice";
  }
  return "?";
}

// How a row of the table reaches its members: type-erased accessors made, per option, from the
// member pointers of Options and OptionOverrides by make_access() below.
struct detail::OptionAccess {
  OptionValue (*get)(const Options&);
  std::optional<OptionValue> (*get_set)(const OptionOverrides&);
  void (*set_text)(OptionOverrides&, const OptionSpec&, const std::string&, const std::string&);
  void (*set_value)(OptionOverrides&, const OptionSpec&, const OptionValue&, const std::string&);
  // Copies the value of `from` into `to` when it is set; returns whether it was.
  bool (*apply)(Options& to, const OptionOverrides& from);
};

namespace {

std::string shown(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(v);
        if constexpr (std::is_same_v<T, std::string>) return "\"" + v + "\"";
      },
      value);
}

// The name the messages give for where a value came from: the option's own name by default.
const std::string& where(const OptionSpec& spec, const std::string& what, std::string& storage) {
  if (!what.empty()) return what;
  storage = spec.name;
  return storage;
}

// Runs a parser and tags any InvalidArgument it throws with the option's name.
template <typename F>
auto naming(const OptionSpec& spec, F&& parse) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    if (!e.option().empty()) throw;
    throw InvalidArgument(e.what(), spec.name);
  }
}

// `value` (written `text` where it came from) must lie in the row's range.
void check_range(const OptionSpec& spec, const std::string& what, bool negative,
                 std::uint64_t magnitude, const std::string& text) {
  if (!negative && magnitude >= static_cast<std::uint64_t>(spec.min) &&
      magnitude <= static_cast<std::uint64_t>(spec.max)) {
    return;
  }
  std::string message =
      fmt::format("{} must be between {} and {}{}{}, got {}{}", spec.name, spec.min, spec.max,
                  spec.unit[0] ? " " : "", spec.unit, negative ? "-" : "", magnitude);
  if (!what.empty() && what != spec.name) {
    message = fmt::format("invalid value '{}' for {}: {}", text, what, message);
  }
  throw InvalidArgument(message, spec.name);
}

template <typename T>
struct Codec;

// The choices: text and typed value are the same string.
template <typename T, T (*Parse)(const std::string&, const std::string&)>
struct ChoiceCodec {
  static T from_text(const OptionSpec& spec, const std::string& text, const std::string& what) {
    std::string storage;
    return naming(spec, [&] { return Parse(text, where(spec, what, storage)); });
  }
  static T from_value(const OptionSpec& spec, const OptionValue& value, const std::string& what) {
    if (const auto* s = std::get_if<std::string>(&value)) return from_text(spec, *s, what);
    std::string storage;
    reject_option_type(spec, shown(value), where(spec, what, storage));
  }
  static OptionValue to_value(T v) { return std::string(to_string(v)); }
};
template <>
struct Codec<EngineKind> : ChoiceCodec<EngineKind, parse_engine> {};
template <>
struct Codec<DirectIo> : ChoiceCodec<DirectIo, parse_direct> {};
template <>
struct Codec<GpuDirect> : ChoiceCodec<GpuDirect, parse_gpu_direct> {};
template <>
struct Codec<CachedReads> : ChoiceCodec<CachedReads, parse_cached_reads> {};

template <>
struct Codec<bool> {
  static bool from_text(const OptionSpec& spec, const std::string& text, const std::string& what) {
    std::string storage;
    return naming(spec, [&] { return parse_bool(text, where(spec, what, storage)); });
  }
  static bool from_value(const OptionSpec& spec, const OptionValue& value,
                         const std::string& what) {
    if (const auto* b = std::get_if<bool>(&value)) return *b;
    std::string storage;
    reject_option_type(spec, shown(value), where(spec, what, storage));
  }
  static OptionValue to_value(bool v) { return v; }
};

// Sizes (unit "bytes": text may carry a K/M/G/T suffix) and counts; range-checked here, so that
// every route that sets one refuses the same values.
template <typename T>
struct IntegerCodec {
  static bool sized(const OptionSpec& spec) { return std::string_view(spec.unit) == "bytes"; }
  static T from_text(const OptionSpec& spec, const std::string& text, const std::string& what) {
    std::string storage;
    const std::string& w = where(spec, what, storage);
    const std::size_t v =
        naming(spec, [&] { return sized(spec) ? parse_size(text, w) : parse_count(text, w); });
    check_range(spec, w, false, v, text);
    return static_cast<T>(v);
  }
  static T from_value(const OptionSpec& spec, const OptionValue& value, const std::string& what) {
    std::string storage;
    const std::string& w = where(spec, what, storage);
    if (const auto* i = std::get_if<std::int64_t>(&value)) {
      const bool negative = *i < 0;
      const std::uint64_t magnitude =
          negative ? std::uint64_t{0} - static_cast<std::uint64_t>(*i) : *i;
      check_range(spec, w, negative, magnitude, std::to_string(*i));
      return static_cast<T>(*i);
    }
    const auto* s = std::get_if<std::string>(&value);
    if (s != nullptr && sized(spec)) return from_text(spec, *s, what);
    reject_option_type(spec, shown(value), w);
  }
  static OptionValue to_value(T v) { return static_cast<std::int64_t>(v); }
};
template <>
struct Codec<std::size_t> : IntegerCodec<std::size_t> {};
template <>
struct Codec<unsigned> : IntegerCodec<unsigned> {};

template <typename M>
struct member;
template <typename C, typename T>
struct member<T C::*> {
  using type = T;
};

template <auto Value, auto Override>
constexpr detail::OptionAccess make_access() {
  using T = typename member<decltype(Value)>::type;
  using C = Codec<T>;
  return {
      [](const Options& o) { return C::to_value(o.*Value); },
      [](const OptionOverrides& o) -> std::optional<OptionValue> {
        if (!(o.*Override)) return std::nullopt;
        return C::to_value(*(o.*Override));
      },
      [](OptionOverrides& o, const OptionSpec& spec, const std::string& text,
         const std::string& what) { o.*Override = C::from_text(spec, text, what); },
      [](OptionOverrides& o, const OptionSpec& spec, const OptionValue& value,
         const std::string& what) { o.*Override = C::from_value(spec, value, what); },
      [](Options& to, const OptionOverrides& from) {
        if (!(from.*Override)) return false;
        to.*Value = *(from.*Override);
        return true;
      },
  };
}

template <auto Value, auto Override>
constexpr detail::OptionAccess kAccess = make_access<Value, Override>();

// The option table: the one list of the options. Defaults are Options' member initialisers.
constexpr OptionSpec kOptions[] = {
    {"engine", "NVIO_ENGINE", OptionType::Choice, 0, 0, "", kEngineWords,
     "I/O engine; auto picks the best one this kernel offers",
     &kAccess<&Options::engine, &OptionOverrides::engine>},
    {"block_size", "NVIO_BLOCK_SIZE", OptionType::Integer, kMinBlockSize, kMaxBlockSize, "bytes",
     "a size in bytes, optionally with a K, M, G or T suffix", "Bytes per piece",
     &kAccess<&Options::block_size, &OptionOverrides::block_size>},
    {"queue_depth", "NVIO_QUEUE_DEPTH", OptionType::Integer, 1, kMaxQueueDepth, "",
     "a non-negative integer", "Pieces in flight per worker",
     &kAccess<&Options::queue_depth, &OptionOverrides::queue_depth>},
    {"single_submit", "NVIO_SINGLE_SUBMIT", OptionType::Boolean, 0, 0, "", kBoolWords,
     "Submit one piece per system call",
     &kAccess<&Options::single_submit, &OptionOverrides::single_submit>},
    {"overlap_events", "NVIO_OVERLAP_EVENTS", OptionType::Boolean, 0, 0, "", kBoolWords,
     "Refill the queue as pieces complete, instead of submitting a batch and waiting for all of "
     "it",
     &kAccess<&Options::overlap_events, &OptionOverrides::overlap_events>},
    {"intra_op_parallelism", "NVIO_INTRA_OP_PARALLELISM", OptionType::Integer, 1, kMaxParallelism,
     "", "a non-negative integer", "Workers per operation",
     &kAccess<&Options::intra_op_parallelism, &OptionOverrides::intra_op_parallelism>},
    {"direct", "NVIO_DIRECT", OptionType::Choice, 0, 0, "", kModeWords, "O_DIRECT",
     &kAccess<&Options::direct, &OptionOverrides::direct>},
    {"gpu_direct", "NVIO_GPU_DIRECT", OptionType::Choice, 0, 0, "", kModeWords,
     "GPUDirect Storage (cuFile) for device memory",
     &kAccess<&Options::gpu_direct, &OptionOverrides::gpu_direct>},
    {"cached_reads", "NVIO_CACHED_READS", OptionType::Choice, 0, 0, "", kCachedWords,
     "Under direct=auto, a read (not a small one) takes what the page cache holds of it through "
     "the page cache, the rest direct; off: direct whatever is cached",
     &kAccess<&Options::cached_reads, &OptionOverrides::cached_reads>},
};

}  // namespace

std::span<const OptionSpec> option_specs() noexcept { return kOptions; }

const OptionSpec* find_option(std::string_view name) noexcept {
  for (const OptionSpec& spec : kOptions) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

const OptionSpec& option_spec(std::string_view name) {
  if (const OptionSpec* spec = find_option(name)) return *spec;
  std::string known;
  for (const OptionSpec& spec : kOptions)
    known += (known.empty() ? "" : ", ") + std::string(spec.name);
  throw InvalidArgument(fmt::format("unknown option '{}'; known options: {}", name, known));
}

void reject_option_type(const OptionSpec& spec, const std::string& shown_value,
                        const std::string& what) {
  const char* expected = spec.type == OptionType::Boolean   ? "true or false"
                         : spec.type == OptionType::Integer ? "a non-negative integer"
                                                            : "a string";
  throw InvalidArgument(fmt::format("{} must be {}, got {}", what, expected, shown_value),
                        spec.name);
}

void Options::validate() const {
  if (engine == EngineKind::CuFile) {
    throw InvalidArgument(
        "engine=cuFile: cuFile is not a handle's engine; device memory moves through it when "
        "gpu_direct picks it (gpu_direct=auto or on)");
  }
  for (const OptionSpec& spec : kOptions) {
    if (spec.type != OptionType::Integer) continue;
    const auto value = static_cast<std::uint64_t>(std::get<std::int64_t>(spec.access->get(*this)));
    check_range(spec, spec.name, false, value, std::to_string(value));
  }
}

OptionValue Options::get(std::string_view name) const {
  return option_spec(name).access->get(*this);
}

void OptionOverrides::set_text(std::string_view name, const std::string& text,
                               const std::string& what) {
  const OptionSpec& spec = option_spec(name);
  spec.access->set_text(*this, spec, text, what);
}

void OptionOverrides::set_value(std::string_view name, const OptionValue& value,
                                const std::string& what) {
  const OptionSpec& spec = option_spec(name);
  spec.access->set_value(*this, spec, value, what);
}

std::optional<OptionValue> OptionOverrides::get(std::string_view name) const {
  return option_spec(name).access->get_set(*this);
}

const std::map<std::string, std::string>& EffectiveOptions::environment_names() {
  static const std::map<std::string, std::string> names = [] {
    std::map<std::string, std::string> out;
    for (const OptionSpec& spec : kOptions) out[spec.name] = spec.environment;
    return out;
  }();
  return names;
}

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
  for (const OptionSpec& spec : kOptions) {
    OptionSource& source = out.sources[spec.name];
    source = OptionSource::Default;
    if (spec.access->apply(out.values, saved)) source = OptionSource::Config;
    // Parsed and range-checked here, not only in the merged result: a bad variable is a mistake
    // the user must hear about even when an explicit value replaces it.
    if (const char* text = getenv(spec.environment); text != nullptr) {
      OptionOverrides environment;
      spec.access->set_text(environment, spec, text, spec.environment);
      spec.access->apply(out.values, environment);
      source = OptionSource::Environment;
    }
    if (spec.access->apply(out.values, overrides)) source = OptionSource::Explicit;
  }
  // The configuration file and the environment were range-checked as they were read, so only an
  // explicit value can still be out of range here; the message names the option.
  out.values.validate();
  return out;
}

}  // namespace nvio
