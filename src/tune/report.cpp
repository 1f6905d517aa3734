// The tuner's result as JSON and as a configuration profile: one format for the CLI and Python.
#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "nvio/system.hpp"
#include "nvio/tune.hpp"

namespace nvio {
namespace {

using nlohmann::json;

// gpu_direct only for device memory: host trials never consult it.
json options_json(const Options& o, MemoryKind memory) {
  json out = {
      {"engine", to_string(o.engine)},      {"block_size", o.block_size},
      {"queue_depth", o.queue_depth},       {"single_submit", o.single_submit},
      {"overlap_events", o.overlap_events}, {"intra_op_parallelism", o.intra_op_parallelism},
      {"direct", to_string(o.direct)}};
  if (memory == MemoryKind::Device) out["gpu_direct"] = to_string(o.gpu_direct);
  return out;
}

json pick_json(const std::optional<TunePick>& p, MemoryKind memory) {
  if (!p) return nullptr;
  return {{"options", options_json(p->options, memory)},
          {"median_gbps", p->gbps},
          {"spread", p->spread},
          {"repeats", p->repeats},
          {"cpu_s_per_gb", p->cpu_seconds_per_gb},
          {"runner_up_gbps", p->runner_up_gbps}};
}

const char* pick_name(const TuneResult& r) {
  return r.mixed ? "mixed" : (r.read ? "read" : "write");
}

}  // namespace

std::string to_json(const TuneResult& r, int indent) {
  json points = json::array();
  for (const TunePoint& p : r.points) {
    json samples = json::array();
    for (const TuneSample& s : p.samples) samples.push_back(s.gbps);
    points.push_back({{"mode", to_string(p.mode)},
                      {"options", options_json(p.options, r.memory)},
                      {"samples_gbps", samples},
                      {"median_gbps", p.median_gbps()},
                      {"spread", p.spread()},
                      {"cpu_s_per_gb", p.cpu_seconds_per_gb()}});
  }
  json modes = json::array();
  for (TuneMode m : r.modes) modes.push_back(to_string(m));
  json mixed = nullptr;
  if (r.mixed) {
    mixed = {{"options", options_json(r.mixed->options, r.memory)},
             {"read_gbps", r.mixed->read_gbps},
             {"write_gbps", r.mixed->write_gbps},
             {"mixed_gbps", r.mixed->mixed_gbps}};
  }
  json deepspeed = nullptr;
  if (r.read || r.write || r.mixed) {
    // The keys DeepSpeed's "aio" configuration section reads, booleans as JSON booleans.
    const Options o = r.recommended();
    deepspeed = {{"aio",
                  {{"block_size", o.block_size},
                   {"queue_depth", o.queue_depth},
                   {"intra_op_parallelism", o.intra_op_parallelism},
                   {"single_submit", o.single_submit},
                   {"overlap_events", o.overlap_events}}}};
  }
  const json out = {
      {"nvio_version", version()},
      {"directory", r.directory},
      {"device", r.device},
      {"filesystem", r.filesystem},
      {"file_size", r.file_size},
      {"trial_bytes", r.trial_bytes},
      {"memory", to_string(r.memory)},
      {"strategy", to_string(r.strategy)},
      {"budget_s", r.budget_s},
      {"elapsed_s", r.elapsed_s},
      {"modes", modes},
      {"warnings", r.warnings},
      {"points", points},
      {"best",
       {{"read", pick_json(r.read, r.memory)},
        {"write", pick_json(r.write, r.memory)},
        {"mixed", mixed}}},
      {"recommended", (r.read || r.write || r.mixed) ? json(pick_name(r)) : json(nullptr)},
      {"deepspeed", deepspeed}};
  return out.dump(indent);
}

ConfigProfile to_profile(const TuneResult& r) {
  const Options best = r.recommended();
  ConfigProfile p;
  p.key = r.device;
  std::error_code ec;
  const auto dir = std::filesystem::absolute(r.directory, ec);
  p.directory = ec ? r.directory : dir.lexically_normal().string();
  p.filesystem = r.filesystem;
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  p.saved_at = stamp;
  p.note = r.strategy == TuneStrategy::Grid
               ? fmt::format("nvio tune --grid, {} pick", pick_name(r))
               : fmt::format("nvio tune, {} pick, {:.0f} s budget", pick_name(r), r.budget_s);
  p.options.engine = best.engine;
  p.options.block_size = best.block_size;
  p.options.queue_depth = best.queue_depth;
  p.options.intra_op_parallelism = best.intra_op_parallelism;
  p.options.single_submit = best.single_submit;
  p.options.overlap_events = best.overlap_events;
  p.options.direct = best.direct;
  if (r.gpu_direct_searched) p.options.gpu_direct = best.gpu_direct;
  return p;
}

}  // namespace nvio
