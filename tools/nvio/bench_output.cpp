// `nvio bench`'s output: a table, or one JSON object (--json) with each result's medians, rates,
// latencies and the handle's counters over its timed loops.
#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "bench_impl.hpp"
#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/gpu.hpp"
#include "nvio/handle.hpp"
#include "nvio/memory.hpp"
#include "nvio/options.hpp"
#include "nvio/pattern.hpp"
#include "nvio/stripe.hpp"
#include "nvio/system.hpp"
#include "procs.hpp"

namespace nvio_cli::bench {

namespace {

// ---- output -------------------------------------------------------------------------------------

// A random result's own keys: the medians over loops of the operations, the rates and the latency
// percentiles, and each loop's figures.
void add_random_json(nlohmann::json& j, const OpResult& r) {
  nlohmann::json ops = nlohmann::json::array();
  nlohmann::json iops = nlohmann::json::array();
  nlohmann::json latency = nlohmann::json::array();
  for (const Sample& s : r.samples) {
    ops.push_back(s.ops);
    iops.push_back(static_cast<double>(s.ops) / s.seconds);
    latency.push_back({s.p50_us, s.p99_us, s.p999_us});
  }
  const double median_ops = median_of(r, [](const Sample& s) { return s.ops; });
  j["block_bytes"] = r.bytes;
  j["bytes"] = static_cast<std::uint64_t>(std::llround(median_ops)) * r.bytes;
  j["ops"] = std::llround(median_ops);
  j["ops_all"] = ops;
  j["iops"] = median_of(r, [](const Sample& s) { return static_cast<double>(s.ops) / s.seconds; });
  j["iops_all"] = iops;
  j["gb_per_s"] = median_of(r, [&](const Sample& s) { return loop_bytes(r, s) / s.seconds / 1e9; });
  j["gib_per_s"] =
      median_of(r, [&](const Sample& s) { return loop_bytes(r, s) / s.seconds / (1 << 30); });
  j["lat_p50_us"] = median_of(r, [](const Sample& s) { return s.p50_us; });
  j["lat_p99_us"] = median_of(r, [](const Sample& s) { return s.p99_us; });
  j["lat_p999_us"] = median_of(r, [](const Sample& s) { return s.p999_us; });
  j["lat_us_all"] = latency;
}

// A striped run: each drive's bytes, median seconds until its last byte, and the GB/s of those
// (not the median of the loops' rates, which differs from it when the loops are even in number).
nlohmann::json drives_json(const OpResult& r, const Plan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t d = 0; d < r.drive_bytes.size(); ++d) {
    const auto bytes = static_cast<double>(r.drive_bytes[d]);
    const double seconds = median_of(r, [&](const Sample& s) { return s.drive_seconds.at(d); });
    out.push_back({{"directory", plan.stripe_dirs.at(d)},
                   {"bytes", r.drive_bytes[d]},
                   {"seconds", seconds},
                   {"gb_per_s", seconds > 0 ? bytes / seconds / 1e9 : 0.0}});
  }
  return out;
}

// The counters by name (nvio::handle_stats_fields) and "errors": failed operations by errno, whose
// keys are the errno numbers as strings.
nlohmann::json stats_json(const nvio::HandleStats& stats) {
  nlohmann::json j = nlohmann::json::object();
  for (const nvio::HandleStatsField& f : nvio::handle_stats_fields()) j[f.name] = stats.*f.member;
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [err, count] : stats.errors) errors[std::to_string(err)] = count;
  j["errors"] = errors;
  return j;
}

nlohmann::json result_json(const OpResult& r, const nvio::Handle& handle, const Plan& plan) {
  double seconds = median_seconds(r);
  double bytes = static_cast<double>(r.bytes);
  nlohmann::json all = nlohmann::json::array();
  for (const Sample& s : r.samples) all.push_back(s.seconds);
  nlohmann::json j = {
      {"op", r.op},
      {"engine", nvio::to_string(handle.engine())},
      {"bytes", r.bytes},
      {"seconds", seconds},
      {"gb_per_s", seconds > 0 ? bytes / seconds / 1e9 : 0.0},
      {"gib_per_s", seconds > 0 ? bytes / seconds / (1024.0 * 1024 * 1024) : 0.0},
      {"cpu_s_per_gb", median_cpu_s_per_gb(r)},
      {"verified", r.verified ? nlohmann::json(*r.verified) : nlohmann::json(nullptr)},
      {"synced", plan.sync && std::string_view(r.op) == "write"},
      {"loops", r.samples.size()},
      {"seconds_all", all},
      {"stats", r.stats ? stats_json(*r.stats) : nlohmann::json(nullptr)}};
  if (plan.pattern == Pattern::Random) add_random_json(j, r);
  if (!r.drive_bytes.empty()) j["drives"] = drives_json(r, plan);
  if (plan.gate) {
    nlohmann::json starts = nlohmann::json::array();
    nlohmann::json ends = nlohmann::json::array();
    for (const Sample& s : r.samples) {
      starts.push_back(std::chrono::nanoseconds(s.start.time_since_epoch()).count());
      ends.push_back(std::chrono::nanoseconds(s.end.time_since_epoch()).count());
    }
    j["start_ns_all"] = starts;
    j["end_ns_all"] = ends;
  }
  return j;
}

}  // namespace

void print_json(const std::vector<OpResult>& results, const nvio::Handle& handle,
                const Plan& plan) {
  nlohmann::json out;
  out["results"] = nlohmann::json::array();
  for (const OpResult& r : results) out["results"].push_back(result_json(r, handle, plan));
  out["options"] = options_to_json(handle.options());
  out["engine"] = nvio::to_string(handle.engine());
  out["engine_reason"] = handle.engine_reason();
  out["options_sources"] = sources_to_json(plan.options);
  out["config"] = config_to_json(plan.options);
  out["file"] = plan.path;
  if (!plan.stripe_dirs.empty()) {
    nlohmann::json drives = nlohmann::json::array();
    for (const nvio::EffectiveOptions& eff : plan.drive_options) {
      drives.push_back({{"options", options_to_json(eff.values)},
                        {"options_sources", sources_to_json(eff)},
                        {"config", config_to_json(eff)}});
    }
    out["stripe"] = {
        {"directories", plan.stripe_dirs}, {"stripe_size", plan.stripe_size}, {"drives", drives}};
  }
  out["size"] = plan.size;
  out["pattern"] = plan.pattern == Pattern::Random ? "random" : "sequential";
  if (plan.pattern == Pattern::Sequential) {
    out["offset"] = plan.offset;
  } else {
    const RandomPlan& r = plan.random;
    out["file_size"] = r.file_size;
    out["ops_limit"] = r.ops ? nlohmann::json(*r.ops) : nlohmann::json(nullptr);
    out["duration_s"] = r.duration ? nlohmann::json(*r.duration) : nlohmann::json(nullptr);
    out["outstanding"] = r.outstanding;
    out["batch"] = r.batch;
  }
  out["memory"] = memory_name(plan);
  if (plan.memory != Plan::Memory::Host) {
    const nvio::GpuInfo& gpu = nvio::gpu_info();
    out["device"] = {{"ordinal", plan.device},
                     {"name", gpu.devices.at(static_cast<std::size_t>(plan.device)).name},
                     {"gds_mode", nvio::to_string(gpu.gds_mode)},
                     {"gds_reason", gpu.gds_reason}};
  }
  out["version"] = nvio::version();
  fmt::print("{}\n", out.dump(2));
}

namespace {

void print_random_rows(const std::vector<OpResult>& results, const nvio::Handle& handle,
                       const Plan& plan) {
  fmt::print(
      "GB/s = 1e9 bytes/s; latency = submission to completion seen, in us{}; all "
      "figures are medians over loops\n\n",
      plan.random.batch > 1 ? " (each operation of a batch gets the batch's)" : "");
  fmt::print("{:<6} {:>10} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "op", "ops",
             "seconds", "IOPS", "GB/s", "p50 us", "p99 us", "p99.9 us", "CPU s/GB", "verified");
  for (const OpResult& r : results) {
    nlohmann::json j = result_json(r, handle, plan);
    std::string verified = r.verified ? (*r.verified ? "yes" : "NO") : "-";
    fmt::print(
        "{:<6} {:>10} {:>8.3f} {:>10.0f} {:>8.3f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.4f} {:>9}\n",
        r.op, j["ops"].get<std::int64_t>(), j["seconds"].get<double>(), j["iops"].get<double>(),
        j["gb_per_s"].get<double>(), j["lat_p50_us"].get<double>(), j["lat_p99_us"].get<double>(),
        j["lat_p999_us"].get<double>(), j["cpu_s_per_gb"].get<double>(), verified);
  }
}

// Every option but the engine, as resolved: "block_size 1 MiB, queue_depth 8, ...".
std::string settings_text(const nvio::Options& o) {
  std::string settings;
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    if (std::string_view(spec.name) == "engine") continue;
    const nvio::OptionValue value = o.get(spec.name);
    const std::string text =
        std::string_view(spec.unit) == "bytes"
            ? human_bytes(static_cast<unsigned long long>(std::get<std::int64_t>(value)))
            : std::visit([](const auto& v) { return fmt::format("{}", v); }, value);
    settings += fmt::format("{}{} {}", settings.empty() ? "" : ", ", spec.name, text);
  }
  return settings;
}

}  // namespace

void print_table(const std::vector<OpResult>& results, const nvio::Handle& handle,
                 const Plan& plan) {
  const nvio::Options& o = handle.options();
  if (plan.pattern == Pattern::Random) {
    const RandomPlan& r = plan.random;
    const std::string until = r.ops && r.duration
                                  ? fmt::format("{} ops or {} s", *r.ops, *r.duration)
                              : r.ops ? fmt::format("{} ops", *r.ops)
                                      : fmt::format("{} s", *r.duration);
    fmt::print(
        "nvio bench: random {} ({} bytes) blocks over {} of file {}, {} in flight, {} per "
        "submission, {} loop(s) of {}\n",
        human_bytes(plan.size), plan.size, human_bytes(r.file_size), plan.path, r.outstanding,
        r.batch, plan.loops, until);
  } else {
    fmt::print("nvio bench: {} ({} bytes){}, {} loop(s), file {}\n", human_bytes(plan.size),
               plan.size, plan.offset ? fmt::format(" at offset {}", plan.offset) : "", plan.loops,
               plan.path);
    if (!plan.stripe_dirs.empty()) {
      fmt::print("striped over {} drives in {} stripes, one handle each: {}\n",
                 plan.stripe_dirs.size(), human_bytes(plan.stripe_size),
                 fmt::join(plan.stripe_dirs, ", "));
    }
  }
  // The engine in use (never auto) and why, then every other option as resolved.
  fmt::print("engine {} ({}); {}\n", nvio::to_string(handle.engine()), handle.engine_reason(),
             settings_text(o));
  for (std::size_t d = 0; d < plan.drive_options.size(); ++d) {
    const nvio::EffectiveOptions& eff = plan.drive_options[d];
    fmt::print("  drive {}: engine {}; {}{}\n", plan.stripe_dirs[d],
               nvio::to_string(eff.values.engine), settings_text(eff.values),
               eff.config_profile.empty() ? "" : fmt::format(" (profile {})", eff.config_profile));
  }
  if (!plan.options.config_profile.empty()) {
    fmt::print("settings from {} (profile {}): {}\n", plan.options.config_path,
               plan.options.config_profile, configured_names(plan.options));
  }
  if (plan.memory != Plan::Memory::Host) {
    const nvio::GpuInfo& gpu = nvio::gpu_info();
    fmt::print("memory {} on device {} ({}); GDS {} ({})\n", memory_name(plan), plan.device,
               gpu.devices.at(static_cast<std::size_t>(plan.device)).name,
               nvio::to_string(gpu.gds_mode), gpu.gds_reason);
  }
  if (plan.pattern == Pattern::Random) {
    print_random_rows(results, handle, plan);
    return;
  }
  fmt::print("GB/s = 1e9 bytes/s, GiB/s = 2^30 bytes/s; seconds and CPU s/GB are medians\n\n");
  fmt::print("{:<6} {:>14} {:>10} {:>9} {:>9} {:>10} {:>9}\n", "op", "bytes", "seconds", "GB/s",
             "GiB/s", "CPU s/GB", "verified");
  for (const OpResult& r : results) {
    nlohmann::json j = result_json(r, handle, plan);
    std::string verified = r.verified ? (*r.verified ? "yes" : "NO") : "-";
    fmt::print("{:<6} {:>14} {:>10.4f} {:>9.3f} {:>9.3f} {:>10.4f} {:>9}\n", r.op, r.bytes,
               j["seconds"].get<double>(), j["gb_per_s"].get<double>(),
               j["gib_per_s"].get<double>(), j["cpu_s_per_gb"].get<double>(), verified);
    if (!j.contains("drives")) continue;
    for (const auto& d : j["drives"]) {
      fmt::print("  drive {:>14} {:>10.4f} {:>9.3f} {:>9.3f}  {}\n",
                 d["bytes"].get<std::uint64_t>(), d["seconds"].get<double>(),
                 d["gb_per_s"].get<double>(), d["gb_per_s"].get<double>() * 1e9 / (1 << 30),
                 d["directory"].get<std::string>());
    }
  }
}

// Prints the verification failure, if any, and returns whether everything verified.
bool report_verification(const std::vector<OpResult>& results, const nvio::Handle& handle) {
  for (const OpResult& r : results) {
    if (!r.bad_offset) continue;
    std::fprintf(stderr, "nvio: verify failed: first bad byte at file offset %llu (engine %s)\n",
                 static_cast<unsigned long long>(*r.bad_offset), nvio::to_string(handle.engine()));
    return false;
  }
  return true;
}

}  // namespace nvio_cli::bench
