#include "nvio/config.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/config_text.hpp"
#include "core/posix.hpp"
#include "core/retry.hpp"
#include "nvio/errors.hpp"
#include "nvio/json_excerpt.hpp"

namespace nvio {
namespace {

using nlohmann::json;

// A configuration file holds one small profile per drive: a few KiB at most. The cap keeps an
// endless or huge file (NVIO_CONFIG=/dev/zero, a log file by mistake) from hanging the process
// and eating its memory.
constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

// `option` names the handle option at fault, when the mistake is in one's value.
[[noreturn]] void malformed(const std::string& path, const std::string& what,
                            const std::string& option = {}) {
  throw InvalidArgument(fmt::format("configuration file {}: {}", path, what), option);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Every level of the document is checked, so that a misspelt key ("defualt", "optoins") is an
// error rather than a setting silently ignored. `where` is the key path of `object` ("" at the
// top level).
void check_keys(const json& object, const std::vector<std::string>& known, const std::string& path,
                const std::string& where) {
  for (const auto& [name, value] : object.items()) {
    (void)value;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string message =
        fmt::format("unknown key '{}'", where.empty() ? name : where + "." + name);
    const std::string* closest = nullptr;
    std::size_t best = 0;
    for (const std::string& k : known) {
      const std::size_t d = edit_distance(name, k);
      if (closest == nullptr || d < best) {
        closest = &k;
        best = d;
      }
    }
    // Only a near miss is a suggestion; "foo" is not a misspelling of "profiles".
    if (closest != nullptr && best <= std::max<std::size_t>(2, name.size() / 3)) {
      message += fmt::format(" (did you mean '{}'?)", *closest);
    }
    message += fmt::format("; known keys{}: ", where.empty() ? "" : " in " + where);
    bool first = true;
    for (const std::string& k : known) {
      message += (first ? "" : ", ") + k;
      first = false;
    }
    malformed(path, message);
  }
}

std::string json_string(const json& v, const std::string& path, const std::string& where) {
  if (!v.is_string())
    malformed(path, fmt::format("{} must be a string, got {}", where, json_excerpt(v)));
  return v.get<std::string>();
}

// The option names, as the known keys of an "options" object.
const std::vector<std::string>& option_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const OptionSpec& spec : option_specs()) out.emplace_back(spec.name);
    return out;
  }();
  return names;
}

// Every value is parsed and range-checked by the option table (OptionOverrides::set_value), so a
// bad value is reported with its key path even when the environment or the caller overrides it.
OptionOverrides parse_options(const json& j, const std::string& path, const std::string& where) {
  if (!j.is_object()) malformed(path, where + " must be an object");
  check_keys(j, option_names(), path, where);
  OptionOverrides o;
  for (const auto& [name, value] : j.items()) {
    const std::string at = where + "." + name;
    try {
      if (value.is_boolean()) {
        o.set_value(name, value.get<bool>(), at);
      } else if (value.is_number_integer() &&
                 (!value.is_number_unsigned() ||
                  value.get<std::uint64_t>() <= std::uint64_t{INT64_MAX})) {
        o.set_value(name, value.get<std::int64_t>(), at);
      } else if (value.is_string()) {
        o.set_value(name, value.get<std::string>(), at);
      } else if (value.is_number_unsigned() && option_spec(name).type == OptionType::Integer) {
        o.set_text(name, value.dump(), at);  // past int64: out of range, reported as such
      } else {
        reject_option_type(option_spec(name), json_excerpt(value), at);
      }
    } catch (const InvalidArgument& e) {
      malformed(path, e.what(), e.option());
    }
  }
  return o;
}

json options_json(const OptionOverrides& o) {
  json j = json::object();
  for (const OptionSpec& spec : option_specs()) {
    if (const std::optional<OptionValue> value = o.get(spec.name)) {
      j[spec.name] = std::visit([](const auto& v) { return json(v); }, *value);
    }
  }
  return j;
}

json profile_json(const ConfigProfile& p) {
  return json{{"directory", p.directory},
              {"filesystem", p.filesystem},
              {"saved_at", p.saved_at},
              {"note", p.note},
              {"options", options_json(p.options)}};
}

ConfigFile parse_file(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    malformed(path, fmt::format("not valid JSON ({})", e.what()));
  }
  if (!j.is_object()) malformed(path, "the top level must be a JSON object");
  check_keys(j, {"version", "default", "profiles"}, path, "");
  if (!j.contains("version") || j["version"] != 1) {
    malformed(path, "\"version\" must be 1 (written by a different nvio?)");
  }
  ConfigFile file;
  if (j.contains("default")) file.default_key = json_string(j["default"], path, "default");
  if (j.contains("profiles")) {
    const json& profiles = j["profiles"];
    if (!profiles.is_object()) malformed(path, "\"profiles\" must be an object");
    for (const auto& item : profiles.items()) {
      // Not a structured binding: clang before 16 cannot capture one in the lambda below.
      const std::string& key = item.key();
      const json& p = item.value();
      const std::string where = "profiles." + key;
      if (!p.is_object()) malformed(path, where + " must be an object");
      check_keys(p, {"directory", "filesystem", "saved_at", "note", "options"}, path, where);
      ConfigProfile profile;
      profile.key = key;
      auto text_field = [&](const char* name, std::string& out) {
        if (p.contains(name)) out = json_string(p[name], path, where + "." + name);
      };
      text_field("directory", profile.directory);
      text_field("filesystem", profile.filesystem);
      text_field("saved_at", profile.saved_at);
      text_field("note", profile.note);
      if (!p.contains("options")) malformed(path, where + " has no \"options\"");
      profile.options = parse_options(p["options"], path, where + ".options");
      file.profiles.push_back(std::move(profile));
    }
  }
  if (!file.default_key.empty() && select_profile(file, {}) == std::nullopt) {
    malformed(path, fmt::format("\"default\" names profile '{}', which is not in \"profiles\"",
                                file.default_key));
  }
  return file;
}

std::string key_of(const struct stat& st) {
  return fmt::format("dev:{}:{}", major(st.st_dev), minor(st.st_dev));
}

const char* file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The whole file, or nullopt when it does not exist. The checks use statx on the descriptor that
// is then read, not a stat of the path, so the file cannot be swapped in between.
std::optional<std::string> read_config_text(const std::string& path) {
  // O_NONBLOCK: opening a FIFO that has no writer returns at once instead of waiting for one (the
  // check below then refuses it); it changes nothing for a regular file.
  const int raw = detail::open_file(path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (raw < 0) {
    if (raw == -ENOENT) return std::nullopt;
    throw_io_error(IoOp::Open, path, 0, 0, -raw, "cannot read the configuration file");
  }
  const detail::FileDescriptor fd(raw);
  detail::FileFacts facts;
  if (const int rc = detail::file_facts(fd.get(), facts); rc < 0) {
    throw_io_error(IoOp::Stat, path, 0, 0, -rc, "cannot read the configuration file");
  }
  if (facts.type == detail::FileType::Directory) {
    throw_io_error(IoOp::Open, path, 0, 0, EISDIR, "the configuration file must be a regular file");
  }
  if (facts.type != detail::FileType::Regular) {
    malformed(path, fmt::format("is {}, not a regular file", file_kind(facts.mode)));
  }
  auto too_big = [&](const char* qualifier, std::uint64_t size) {
    malformed(path, fmt::format("{}{} bytes is over the {}-byte limit of a configuration file",
                                qualifier, size, kMaxConfigBytes));
  };
  if (static_cast<std::uint64_t>(facts.size) > kMaxConfigBytes) {
    too_big("", static_cast<std::uint64_t>(facts.size));
  }
  // Read to the end rather than trusting st_size, but never past the cap: the file may have grown
  // since the statx.
  std::string text;
  text.reserve(static_cast<std::size_t>(facts.size));
  char chunk[16384];
  while (true) {
    const ssize_t n = detail::retry_interrupted([&]() -> ssize_t {
      const ssize_t r = ::read(fd.get(), chunk, sizeof chunk);
      return r < 0 ? -errno : r;
    });
    if (n < 0) throw_io_error(IoOp::Read, path, text.size(), sizeof chunk, static_cast<int>(-n));
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigBytes) too_big("at least ", text.size());
  }
  return text;
}

}  // namespace

std::string config_path(const EnvLookup& getenv_fn) {
  const EnvLookup getenv = getenv_fn ? getenv_fn : [](const char* n) { return std::getenv(n); };
  if (const char* explicit_path = getenv("NVIO_CONFIG"); explicit_path != nullptr) {
    const std::string p = explicit_path;
    if (p == "none") return {};
    if (p.empty()) {
      throw InvalidArgument(
          "NVIO_CONFIG is set but empty: give a file path, or 'none' to turn "
          "the configuration file off");
    }
    return p;
  }
  if (const char* xdg = getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/nvio/config.json";
  }
  if (const char* home = getenv("HOME"); home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.config/nvio/config.json";
  }
  return {};
}

std::string device_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_io_error(IoOp::Stat, path, 0, 0, errno);
  return key_of(st);
}

std::optional<ConfigFile> load_config(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::optional<std::string> text = read_config_text(path);
  if (!text) return std::nullopt;
  return parse_file(*text, path);
}

std::optional<ConfigProfile> select_profile(const ConfigFile& file, const std::string& directory) {
  auto find = [&](const std::string& key) -> std::optional<ConfigProfile> {
    for (const ConfigProfile& p : file.profiles) {
      if (p.key == key) return p;
    }
    return std::nullopt;
  };
  if (!directory.empty()) {
    struct stat st {};
    if (::stat(directory.c_str(), &st) == 0) {
      if (auto p = find(key_of(st))) return p;
    }
  }
  if (file.default_key.empty()) return std::nullopt;
  return find(file.default_key);
}

std::string detail::config_text_with(const ConfigFile& file, const ConfigProfile& profile) {
  json profiles = json::object();
  for (const ConfigProfile& p : file.profiles) {
    if (p.key != profile.key) profiles[p.key] = profile_json(p);
  }
  profiles[profile.key] = profile_json(profile);
  const json j{{"version", 1}, {"default", profile.key}, {"profiles", profiles}};
  return j.dump(2) + "\n";
}

}  // namespace nvio
