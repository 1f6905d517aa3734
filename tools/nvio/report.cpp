// `nvio report`: what this machine offers nvio, for bug reports and for choosing options.
//
// Everything is gathered into one JSON document first; the human output is rendered from the
// same document, so the two can never disagree.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"
#include "nvio/options.hpp"
#include "nvio/system.hpp"

namespace nvio_cli {

using nlohmann::json;

std::string human_bytes(unsigned long long bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return fmt::format("{} {}", bytes, kUnits[unit]);
}

json options_to_json(const nvio::Options& o) {
  json out = json::object();
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    out[spec.name] = std::visit([](const auto& v) { return json(v); }, o.get(spec.name));
  }
  return out;
}

json sources_to_json(const nvio::EffectiveOptions& eff) {
  json out = json::object();
  for (const auto& [name, source] : eff.sources) out[name] = nvio::to_string(source);
  return out;
}

json config_to_json(const nvio::EffectiveOptions& eff) {
  return {{"path", eff.config_path.empty() ? json(nullptr) : json(eff.config_path)},
          {"found", eff.config_found},
          {"profile", eff.config_profile.empty() ? json(nullptr) : json(eff.config_profile)}};
}

std::string configured_names(const nvio::EffectiveOptions& eff) {
  std::string out;
  for (const auto& [name, source] : eff.sources) {
    if (source != nvio::OptionSource::Config) continue;
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "none (overridden)" : out;
}

void add_report_options(CLI::App& app, ReportArgs& args) {
  app.add_option_function<std::string>(
         "--dir",
         [&args](const std::string& dir) {
           args.dir = dir;
           args.dir_given = true;
         },
         "Directory to probe for O_DIRECT support and alignment (default: the current one; one "
         "that cannot be probed there, say not writable, is reported as such)")
      ->type_name("DIR");
  app.add_flag("--json", args.json, "Print one JSON object instead of text");
  app.add_option("--cached", args.cached,
                 "Also show how much of FILE is in the page cache (repeatable)")
      ->type_name("FILE")
      ->allow_extra_args(false);
}

void add_evict_options(CLI::App& app, EvictArgs& args) {
  app.add_option("paths", args.paths, "Files to write back and drop from the page cache")
      ->type_name("PATH")
      ->required();
}

namespace {

json optional_json(const std::optional<std::uint64_t>& value) {
  return value ? json(*value) : json(nullptr);
}

json engines_json() {
  json out = json::object();
  for (nvio::EngineKind kind :
       {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
    const nvio::EngineProbe& probe = nvio::probe_engine(kind);
    out[nvio::to_string(kind)] = {{"available", probe.available}, {"reason", probe.reason}};
  }
  return out;
}

// "." becomes "/abs/path/" after normalising; drop the trailing separator people do not write.
std::string absolute_dir(const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

// The probe creates a file in `dir`. Where it cannot (the current directory not writable, say) the
// rest of the report is still worth having: the section says why, unless the user named the
// directory, whose probe was then the point.
json dir_json(const std::string& dir, bool dir_given) {
  try {
    nvio::DirectIoInfo info = nvio::probe_directory(dir);
    return {{"path", absolute_dir(dir)},   {"direct_io", info.supported},
            {"mem_align", info.mem_align}, {"offset_align", info.offset_align},
            {"source", info.source},       {"error", nullptr}};
  } catch (const nvio::IoError& e) {
    if (dir_given) throw;
    return {{"path", absolute_dir(dir)}, {"direct_io", nullptr}, {"mem_align", nullptr},
            {"offset_align", nullptr},   {"source", nullptr},    {"error", e.what()}};
  }
}

// A version number as CUDA encodes it (1000 * major + 10 * minor): 13000 -> "13.0".
json cuda_version(int v) {
  if (v <= 0) return nullptr;
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

json gpu_json() {
  const nvio::GpuInfo& g = nvio::gpu_info();
  json devices = json::array();
  for (const auto& d : g.devices) {
    devices.push_back({{"ordinal", d.ordinal},
                       {"name", d.name},
                       {"memory", d.total_memory},
                       {"pci_bus_id", d.pci_bus_id}});
  }
  return {{"driver",
           {{"loaded", g.driver_loaded},
            {"path", g.driver_path},
            {"reason", g.driver_reason},
            {"version", cuda_version(g.driver_version)}}},
          {"runtime",
           {{"path", g.runtime_path}, {"version", cuda_version(g.runtime_version.value_or(0))}}},
          {"devices", devices},
          {"cufile",
           {{"loaded", g.cufile_loaded}, {"path", g.cufile_path}, {"reason", g.cufile_reason}}},
          {"gds", {{"mode", nvio::to_string(g.gds_mode)}, {"reason", g.gds_reason}}}};
}

json options_json(const nvio::EffectiveOptions& eff) {
  const json values = options_to_json(eff.values);
  json out = json::object();
  for (auto& [name, value] : values.items()) {
    auto it = eff.sources.find(name);
    auto source = it == eff.sources.end() ? nvio::OptionSource::Default : it->second;
    out[name] = {{"value", value}, {"source", nvio::to_string(source)}};
  }
  return out;
}

json cache_json(const std::string& path) {
  const nvio::PageCacheState st = nvio::page_cache_state(path);
  return {{"path", path},
          {"file_bytes", st.file_bytes},
          {"cached_bytes", st.cached_bytes},
          {"dirty_bytes", st.dirty_bytes},
          {"method", st.method}};
}

std::string cache_text(const json& c) {
  const auto file = c["file_bytes"].get<std::uint64_t>();
  const auto cached = c["cached_bytes"].get<std::uint64_t>();
  return fmt::format(
      "{} of {} bytes cached ({:.1f}%), {} dirty, by {}", cached, file,
      file == 0 ? 0.0 : 100.0 * static_cast<double>(cached) / static_cast<double>(file),
      c["dirty_bytes"].get<std::uint64_t>(), c["method"].get<std::string>());
}

json gather(const ReportArgs& args) {
  // Options first: a malformed NVIO_* variable is a usage error and should stop before probing.
  const nvio::EffectiveOptions eff = nvio::resolve_options({}, {}, args.dir);
  json options = options_json(eff);
  nvio::SystemInfo sys = nvio::system_info();
  const nvio::AutoChoice& choice = nvio::auto_engine();
  json cached = json::array();
  for (const std::string& path : args.cached) cached.push_back(cache_json(path));
  json out = {{"version", nvio::version()},
              {"kernel", sys.kernel},
              {"engines", engines_json()},
              {"auto_engine", nvio::to_string(choice.engine)},
              {"auto_reason", choice.reason},
              {"dir", dir_json(args.dir, args.dir_given)},
              {"memlock_limit", optional_json(sys.memlock_limit)},
              {"memlock_capability",
               sys.memlock_capability ? json(*sys.memlock_capability) : json(nullptr)},
              {"aio_max_nr", optional_json(sys.aio_max_nr)},
              {"aio_nr", optional_json(sys.aio_nr)},
              {"gpu", gpu_json()},
              {"options", options},
              {"config", config_to_json(eff)}};
  if (!args.cached.empty()) out["cached"] = cached;
  return out;
}

std::string text_of(const json& value) {
  if (value.is_null()) return "unknown";
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

void print_text(const json& r) {
  fmt::print("nvio {}\n", r["version"].get<std::string>());
  fmt::print("kernel            {}\n", r["kernel"].get<std::string>());
  fmt::print("engines\n");
  for (auto& [name, e] : r["engines"].items()) {
    fmt::print("  {:<16}{:<11}{}\n", name, e["available"].get<bool>() ? "available" : "missing",
               e["reason"].get<std::string>());
  }
  fmt::print("auto engine       {} ({})\n", r["auto_engine"].get<std::string>(),
             r["auto_reason"].get<std::string>());
  const json& d = r["dir"];
  fmt::print("directory         {}\n", d["path"].get<std::string>());
  if (!d["error"].is_null()) {
    fmt::print("  not probed      {} (--dir DIR probes another)\n", d["error"].get<std::string>());
  } else {
    fmt::print("  O_DIRECT        {} ({})\n", d["direct_io"].get<bool>() ? "yes" : "no",
               d["source"].get<std::string>());
    fmt::print("  mem_align       {}\n", d["mem_align"].get<std::uint64_t>());
    fmt::print("  offset_align    {}\n", d["offset_align"].get<std::uint64_t>());
  }
  const json& memlock = r["memlock_limit"];
  const json& capable = r["memlock_capability"];
  fmt::print("RLIMIT_MEMLOCK    {}{}\n",
             memlock.is_null() ? "unlimited" : human_bytes(memlock.get<std::uint64_t>()),
             capable.is_boolean() && capable.get<bool>()
                 ? " (not binding: the process has CAP_IPC_LOCK and may lock more)"
                 : "");
  fmt::print("fs.aio-max-nr     {}\n", text_of(r["aio_max_nr"]));
  fmt::print("fs.aio-nr         {}\n", text_of(r["aio_nr"]));
  const json& g = r["gpu"];
  fmt::print("gpu\n");
  // Loaded: the version and where from; missing: why (the loader's message names the library).
  const json& drv = g["driver"];
  fmt::print("  CUDA driver     {}\n",
             drv["loaded"].get<bool>()
                 ? fmt::format("{} ({})", text_of(drv["version"]), drv["path"].get<std::string>())
                 : "missing (" + drv["reason"].get<std::string>() + ")");
  fmt::print("  CUDA runtime    {} ({})\n", text_of(g["runtime"]["version"]),
             g["runtime"]["path"].get<std::string>());
  for (const auto& d : g["devices"]) {
    fmt::print("  device {:<8} {} ({}, {})\n", d["ordinal"].get<int>(),
               d["name"].get<std::string>(), human_bytes(d["memory"].get<std::uint64_t>()),
               d["pci_bus_id"].get<std::string>());
  }
  if (g["devices"].empty()) fmt::print("  devices         none\n");
  const json& cf = g["cufile"];
  fmt::print("  cuFile          {}\n", cf["loaded"].get<bool>()
                                           ? "loaded (" + cf["path"].get<std::string>() + ")"
                                           : "missing (" + cf["reason"].get<std::string>() + ")");
  fmt::print("  GDS mode        {} ({})\n", g["gds"]["mode"].get<std::string>(),
             g["gds"]["reason"].get<std::string>());
  const json& c = r["config"];
  if (c["path"].is_null()) {
    fmt::print("config file       none (NVIO_CONFIG=none, or no HOME)\n");
  } else if (!c["found"].get<bool>()) {
    fmt::print("config file       {} (not found; `nvio tune --save` writes it)\n",
               c["path"].get<std::string>());
  } else if (c["profile"].is_null()) {
    fmt::print("config file       {} (no profile applies here)\n", c["path"].get<std::string>());
  } else {
    fmt::print("config file       {} (profile {})\n", c["path"].get<std::string>(),
               c["profile"].get<std::string>());
  }
  fmt::print("options (value, source)\n");
  for (auto& [name, o] : r["options"].items()) {
    fmt::print("  {:<22}{:<12}{}\n", name, text_of(o["value"]), o["source"].get<std::string>());
  }
  if (r.contains("cached")) {
    fmt::print("page cache\n");
    for (const auto& c : r["cached"]) {
      fmt::print("  {}: {}\n", c["path"].get<std::string>(), cache_text(c));
    }
  }
}

}  // namespace

int run_evict(const EvictArgs& args) {
  for (const std::string& path : args.paths) {
    const json before = cache_json(path);
    nvio::evict_page_cache(path);
    fmt::print("{}: evicted; before {}; now {}\n", path,
               before["cached_bytes"].get<std::uint64_t>(), cache_text(cache_json(path)));
  }
  return kExitOk;
}

int run_report(const ReportArgs& args) {
  json report = gather(args);
  if (args.json) {
    fmt::print("{}\n", report.dump(2));
  } else {
    print_text(report);
  }
  return kExitOk;
}

}  // namespace nvio_cli
