// The tuner's search on simulated throughput surfaces (with noise and a virtual clock): it must
// find the optimum (within 5%) in far fewer trials than the grid, keep to its budget, and report
// what it measured consistently. The real file measurer is exercised end to end by the CLI tests,
// and here with device memory on the fake device.
#include "nvio/tune.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "fake_device.hpp"
#include "nvio/pattern.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::DirectIo;
using nvio::EngineKind;
using nvio::GpuDirect;
using nvio::Options;
using nvio::TuneMode;

nvio::TuneSpace test_space() {
  nvio::TuneSpace s;
  s.engines = {EngineKind::IoUring, EngineKind::Libaio, EngineKind::Psync};
  for (std::size_t b = 128 << 10; b <= (16u << 20); b *= 2) s.block_sizes.push_back(b);
  for (unsigned q = 1; q <= 256; q *= 2) s.queue_depths.push_back(q);
  s.parallelism = {1, 2, 4};
  return s;
}

// A drive model: throughput rises with block size and queue depth to a knee and falls past it,
// differs per engine and direct mode, and has a second, lower hill (psync with many threads) to
// trap a greedy search. Each trial moves `trial_bytes` and costs that time plus set-up on a
// virtual clock; samples carry multiplicative noise.
class SimulatedDrive final : public nvio::Measurer {
 public:
  SimulatedDrive(unsigned seed, double noise, bool write_prefers_small = false)
      : rng_(seed), noise_(noise), write_prefers_small_(write_prefers_small) {}

  // cuFile (gpu_direct on) moves `gds_gain` times what the best bounce-path point of its block
  // size and parallelism would; it ignores the engine, queue and policies.
  double gds_gain_ = 1.0;

  double truth(const Options& o, TuneMode mode) const {
    if (o.gpu_direct == GpuDirect::On) {
      Options bounce = o;
      bounce.gpu_direct = GpuDirect::Off;
      bounce.engine = EngineKind::IoUring;
      bounce.direct = DirectIo::On;
      bounce.queue_depth = 32;
      bounce.single_submit = false;
      bounce.overlap_events = true;
      return gds_gain_ * truth(bounce, mode);
    }
    const double lb = std::log2(double(o.block_size));
    const double lq = std::log2(double(o.queue_depth));
    const double best_lb = mode == TuneMode::Write && write_prefers_small_ ? 18.0 : 21.0;  // 2 MiB
    double g = 3.0;
    g *= std::exp(-0.08 * (lb - best_lb) * (lb - best_lb));
    if (o.engine == EngineKind::Psync) {
      // No queue; parallelism alone fills the drive, to a lower peak.
      g = 2.2 * std::exp(-0.08 * (lb - 22) * (lb - 22));
      g *= 1 - std::exp(-0.6 * o.intra_op_parallelism);
    } else {
      g *= 1 - std::exp(-0.9 * (lq + 1) * 0.5) * 0.9;  // saturates with depth
      g *= 1 - 0.02 * std::max(0.0, lq - 5);           // too deep costs a little
      g *= o.intra_op_parallelism == 2 ? 1.0 : (o.intra_op_parallelism == 1 ? 0.9 : 0.93);
      if (o.engine == EngineKind::Libaio) g *= 0.96;
      if (o.single_submit) g *= 0.94;
      if (!o.overlap_events) g *= 0.9;
    }
    if (o.direct == DirectIo::Off) g *= 0.7;
    return g;
  }

  nvio::TuneSample measure(const Options& o, TuneMode mode) override {
    ++trials_;
    std::normal_distribution<double> n(1.0, noise_);
    nvio::TuneSample s;
    s.bytes = 256.0 * (1 << 20);
    s.gbps = truth(o, mode) * std::max(0.5, n(rng_));
    s.cpu_seconds = 0.01 * s.bytes / 1e9;
    clock_ += s.bytes / (s.gbps * 1e9) + 0.01;
    return s;
  }
  double now() override { return clock_; }

  double best_truth(const nvio::TuneSpace& space, TuneMode mode) const {
    double best = 0;
    for (const Options& o : space.all()) best = std::max(best, truth(o, mode));
    return best;
  }

  std::size_t trials_ = 0;
  double clock_ = 0;

 private:
  std::mt19937 rng_;
  double noise_;
  bool write_prefers_small_;
};

TEST(TuneSearch, FindsTheOptimumWithinBudgetAcrossSeeds) {
  const nvio::TuneSpace space = test_space();
  const std::size_t grid = space.all().size();
  for (unsigned seed = 1; seed <= 8; ++seed) {
    SimulatedDrive drive(seed, 0.04);
    nvio::TuneSettings settings;
    settings.budget_s = 60;
    const nvio::TuneResult r = nvio::search(space, drive, settings);
    ASSERT_TRUE(r.read && r.write && r.mixed) << "seed " << seed;
    for (TuneMode mode : {TuneMode::Read, TuneMode::Write}) {
      const nvio::TunePick& pick = mode == TuneMode::Read ? *r.read : *r.write;
      const double got = drive.truth(pick.options, mode);
      const double best = drive.best_truth(space, mode);
      EXPECT_GE(got, 0.95 * best) << "seed " << seed << " mode " << nvio::to_string(mode);
      EXPECT_GE(pick.repeats, 3u) << "the pick must rest on repeats, seed " << seed;
    }
    // Within the budget, and using most of it.
    EXPECT_LE(r.elapsed_s, 60 * 1.1) << "seed " << seed;
    EXPECT_GE(r.elapsed_s, 60 * 0.9) << "seed " << seed;
    // Far fewer configurations than the grid per mode.
    EXPECT_LT(r.points.size(), grid / 4) << "seed " << seed;
  }
}

TEST(TuneSearch, MixedPickIsMeasuredBothWaysAndIsTheHarmonicMean) {
  SimulatedDrive drive(7, 0.03, /*write_prefers_small=*/true);
  nvio::TuneSettings settings;
  settings.budget_s = 60;
  const nvio::TuneResult r = nvio::search(test_space(), drive, settings);
  ASSERT_TRUE(r.mixed);
  const nvio::MixedPick& m = *r.mixed;
  EXPECT_NEAR(m.mixed_gbps, 2 * m.read_gbps * m.write_gbps / (m.read_gbps + m.write_gbps), 1e-9);
  // Read and write want different block sizes here: the picks differ, and the mixed pick is
  // measured in both modes.
  EXPECT_NE(r.read->options.block_size, r.write->options.block_size);
  int modes_seen = 0;
  for (const nvio::TunePoint& p : r.points) {
    const Options& o = p.options;
    if (o.engine == m.options.engine && o.block_size == m.options.block_size &&
        o.queue_depth == m.options.queue_depth &&
        o.intra_op_parallelism == m.options.intra_op_parallelism &&
        o.single_submit == m.options.single_submit &&
        o.overlap_events == m.options.overlap_events && o.direct == m.options.direct) {
      ++modes_seen;
    }
  }
  EXPECT_EQ(modes_seen, 2);
  EXPECT_EQ(r.recommended().block_size, m.options.block_size);
}

TEST(TuneSearch, GridMeasuresEverythingAndFindsTheExactOptimumWithoutNoise) {
  nvio::TuneSpace space = test_space();
  space.engines = {EngineKind::IoUring, EngineKind::Psync};
  space.parallelism = {1, 2};
  SimulatedDrive drive(1, 0.0);
  nvio::TuneSettings settings;
  settings.strategy = nvio::TuneStrategy::Grid;
  settings.modes = {TuneMode::Read};
  const nvio::TuneResult r = nvio::search(space, drive, settings);
  EXPECT_EQ(r.points.size(), space.all().size());
  ASSERT_TRUE(r.read);
  EXPECT_FALSE(r.write);
  EXPECT_FALSE(r.mixed);
  EXPECT_DOUBLE_EQ(drive.truth(r.read->options, TuneMode::Read),
                   drive.best_truth(space, TuneMode::Read));
}

TEST(TuneSearch, GridOfBothModesEndsWithAMixedPick) {
  nvio::TuneSpace space = test_space();
  space.engines = {EngineKind::Psync};
  space.parallelism = {1, 2};
  SimulatedDrive drive(1, 0.0);
  nvio::TuneSettings settings;
  settings.strategy = nvio::TuneStrategy::Grid;  // both modes (the default)
  const nvio::TuneResult r = nvio::search(space, drive, settings);
  ASSERT_TRUE(r.read);
  ASSERT_TRUE(r.write);
  ASSERT_TRUE(r.mixed);
  // Every configuration once per mode, the confirm repeats, and two cross rounds: bounded.
  EXPECT_LE(r.points.size(), 2 * space.all().size());
}

TEST(TuneSearch, PsyncIgnoredDimensionsAreFolded) {
  const nvio::TuneSpace space = test_space();
  std::size_t psync = 0;
  for (const Options& o : space.all()) {
    if (o.engine != EngineKind::Psync) continue;
    ++psync;
    EXPECT_EQ(o.queue_depth, 1u);
    EXPECT_FALSE(o.single_submit);
    EXPECT_TRUE(o.overlap_events);
  }
  EXPECT_EQ(psync, space.block_sizes.size() * space.parallelism.size() * space.direct.size());
  EXPECT_EQ(space.all().size(), psync + 2 * space.block_sizes.size() * space.queue_depths.size() *
                                            space.parallelism.size() * 2 * 2 * 2);
}

TEST(TuneSearch, CuFileHoldsWhatItIgnoresAndIsPickedWhenFaster) {
  nvio::TuneSpace space = test_space();
  space.gpu_direct = {GpuDirect::Off, GpuDirect::On};
  std::size_t cufile = 0;
  for (const Options& o : space.all()) {
    if (o.gpu_direct != GpuDirect::On) continue;
    ++cufile;
    EXPECT_EQ(o.engine, space.engines.front());
    EXPECT_EQ(o.direct, DirectIo::On);
    EXPECT_EQ(o.queue_depth, 1u);
    EXPECT_FALSE(o.single_submit);
    EXPECT_TRUE(o.overlap_events);
  }
  EXPECT_EQ(cufile, space.block_sizes.size() * space.parallelism.size());
  nvio::TuneSpace bounce_only = test_space();
  EXPECT_EQ(space.all().size(), cufile + bounce_only.all().size());

  for (const double gain : {1.3, 0.7}) {
    SCOPED_TRACE("cuFile gain " + std::to_string(gain));
    SimulatedDrive drive(9, 0.03);
    drive.gds_gain_ = gain;
    nvio::TuneSettings settings;
    settings.budget_s = 60;
    nvio::TuneResult r = nvio::search(space, drive, settings);
    ASSERT_TRUE(r.read && r.write && r.mixed);
    const GpuDirect want = gain > 1 ? GpuDirect::On : GpuDirect::Off;
    EXPECT_EQ(r.read->options.gpu_direct, want);
    EXPECT_EQ(r.write->options.gpu_direct, want);
    EXPECT_TRUE(r.gpu_direct_searched);
    r.memory = nvio::MemoryKind::Device;
    r.device = "dev:1:2";
    const nvio::ConfigProfile p = nvio::to_profile(r);
    ASSERT_TRUE(p.options.gpu_direct.has_value());
    EXPECT_EQ(*p.options.gpu_direct, r.mixed->options.gpu_direct);
    const std::string json = nvio::to_json(r);
    EXPECT_TRUE(contains(json, "\"memory\": \"device\""));
    EXPECT_TRUE(contains(json, std::string("\"gpu_direct\": \"") + nvio::to_string(want) + "\""));
  }
}

TEST(TuneSearch, OneGpuDirectValueIsAGivenNotAFinding) {
  // The bounce path alone (nvio tune --gpu without --gds): the profile leaves gpu_direct to its
  // default rather than saving "off", and host results do not show it at all.
  SimulatedDrive drive(2, 0.03);
  nvio::TuneSettings settings;
  settings.budget_s = 10;
  nvio::TuneResult r = nvio::search(test_space(), drive, settings);
  EXPECT_FALSE(r.gpu_direct_searched);
  for (const nvio::TunePoint& p : r.points) EXPECT_EQ(p.options.gpu_direct, GpuDirect::Off);
  r.device = "dev:1:2";
  EXPECT_FALSE(nvio::to_profile(r).options.gpu_direct.has_value());
  EXPECT_FALSE(contains(nvio::to_json(r), "gpu_direct"));
  EXPECT_TRUE(contains(nvio::to_json(r), "\"memory\": \"host\""));
}

TEST(TuneSearch, TinyBudgetStillAnswersEachMode) {
  SimulatedDrive drive(3, 0.05);
  drive.clock_ = 5;  // the set-up already ate more than the budget
  nvio::TuneSettings settings;
  settings.budget_s = 1;
  const nvio::TuneResult r = nvio::search(test_space(), drive, settings);
  EXPECT_TRUE(r.read);
  EXPECT_TRUE(r.write);
  EXPECT_EQ(drive.trials_, 2u);
}

TEST(TuneSearch, ProgressIsReported) {
  SimulatedDrive drive(4, 0.03);
  nvio::TuneSettings settings;
  settings.budget_s = 10;
  settings.modes = {TuneMode::Write};
  std::size_t calls = 0;
  double last = -1;
  settings.progress = [&](const nvio::TuneProgress& p) {
    ++calls;
    EXPECT_GE(p.elapsed_s, last);
    last = p.elapsed_s;
    EXPECT_EQ(p.mode, TuneMode::Write);
    EXPECT_TRUE(p.best.has_value());
    EXPECT_DOUBLE_EQ(p.budget_s, 10);
  };
  nvio::search(test_space(), drive, settings);
  EXPECT_EQ(calls, drive.trials_);
}

TEST(TuneSearch, RejectsBadSpacesAndSettings) {
  SimulatedDrive drive(1, 0);
  nvio::TuneSettings settings;
  nvio::TuneSpace s = test_space();
  s.engines.clear();
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.engines.push_back(EngineKind::Auto);
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.engines.push_back(EngineKind::CuFile);  // not a handle's engine: gpu_direct's business
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.direct = {DirectIo::Auto};
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.engines.push_back(EngineKind::Psync);
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.block_sizes.push_back(s.block_sizes.front());
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.queue_depths.push_back(0);
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s = test_space();
  s.gpu_direct = {GpuDirect::Auto};
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s.gpu_direct = {GpuDirect::On, GpuDirect::On};
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  s.gpu_direct = {};
  EXPECT_THROW(nvio::search(s, drive, settings), nvio::InvalidArgument);
  settings.budget_s = 0;
  EXPECT_THROW(nvio::search(test_space(), drive, settings), nvio::InvalidArgument);
  settings.budget_s = std::nan("");
  EXPECT_THROW(nvio::search(test_space(), drive, settings), nvio::InvalidArgument);
  settings.budget_s = 10;
  settings.modes = {};
  EXPECT_THROW(nvio::search(test_space(), drive, settings), nvio::InvalidArgument);
  settings.modes = {TuneMode::Read, TuneMode::Read};
  EXPECT_THROW(nvio::search(test_space(), drive, settings), nvio::InvalidArgument);
  EXPECT_EQ(drive.trials_, 0u);
}

TEST(TuneSearch, JsonAndProfileCarryThePick) {
  SimulatedDrive drive(5, 0.03);
  nvio::TuneSettings settings;
  settings.budget_s = 20;
  nvio::TuneResult r = nvio::search(test_space(), drive, settings);
  r.device = "dev:1:2";
  r.directory = "/x";
  const std::string json = nvio::to_json(r);
  EXPECT_TRUE(contains(json, "\"recommended\": \"mixed\""));
  EXPECT_TRUE(contains(json, "\"intra_op_parallelism\""));
  EXPECT_TRUE(contains(json, "\"samples_gbps\""));
  const nvio::ConfigProfile p = nvio::to_profile(r);
  EXPECT_EQ(p.key, "dev:1:2");
  EXPECT_EQ(p.options.block_size, r.mixed->options.block_size);
  EXPECT_EQ(p.options.engine, r.mixed->options.engine);
  nvio::TuneResult empty;
  EXPECT_THROW(empty.recommended(), nvio::InvalidArgument);
}

// ---- tune_directory with device memory, on the fake device ----------------------------------

constexpr std::size_t kMiB = std::size_t{1} << 20;
// The seed of the pattern the tuner writes its scratch file with (src/tune/directory.cpp).
constexpr std::uint64_t kScratchSeed = 0x7475'6e65;

nvio::TuneRequest device_request(const std::string& dir, unsigned char* memory, std::size_t size) {
  nvio::TuneRequest req;
  req.directory = dir;
  req.file_size = 16 * kMiB;
  req.trial_bytes = 4 * kMiB;
  req.space.engines = {EngineKind::Psync};
  req.space.block_sizes = {kMiB};
  req.space.queue_depths = {1};
  req.space.parallelism = {1, 2};
  req.space.direct = {DirectIo::Off};  // the same on every file system
  req.space.gpu_direct = {GpuDirect::Off, GpuDirect::On};
  req.settings.strategy = nvio::TuneStrategy::Grid;
  req.device_memory = nvio::TuneDeviceMemory{memory, size};
  return req;
}

// The fewest copies between the fake device and the host the filling read and the trials of `r`
// make: one per 1 MiB block of each 4 MiB transfer.
std::size_t device_copies(const nvio::TuneResult& r) {
  std::size_t trials = 0;
  for (const nvio::TunePoint& p : r.points) trials += p.samples.size();
  return 4 * (trials + 1);
}

TEST(TuneDevice, WriteTrialsCarryTheDeviceBytesThroughTheBouncePath) {
  TempDir dir;
  ScopedFakeDevice fake;
  {
    unsigned char* memory = fake->alloc(4 * kMiB, 1);
    std::memset(memory, kSentinel, 4 * kMiB);
    nvio::TuneRequest req = device_request(dir.path(), memory, 4 * kMiB);
    req.settings.modes = {TuneMode::Write};
    req.keep_file = true;
    const nvio::TuneResult r = nvio::tune_directory(req);

    EXPECT_EQ(r.memory, nvio::MemoryKind::Device);
    EXPECT_TRUE(r.gpu_direct_searched);
    ASSERT_TRUE(r.write);
    EXPECT_GE(fake->copies(), device_copies(r)) << "every trial moves the device memory";
    std::map<GpuDirect, std::size_t> points;
    for (const nvio::TunePoint& p : r.points) ++points[p.options.gpu_direct];
    // Each parallelism both ways; the fake device's memory is host memory, which cuFile must
    // never see, so "on" bounces here as "off" does.
    EXPECT_EQ(points[GpuDirect::Off], 2u);
    EXPECT_EQ(points[GpuDirect::On], 2u);
    if (nvio::gpu_info().gds_mode == nvio::GdsMode::Unavailable) {
      EXPECT_TRUE(std::any_of(r.warnings.begin(), r.warnings.end(),
                              [](const std::string& w) { return contains(w, "cuFile"); }));
    }

    // The device memory was filled from the file's first trial through the device path, and the
    // write trials (at least one per slot: four points in turn over four slots) put those bytes
    // in every slot.
    EXPECT_EQ(nvio::pattern::first_mismatch(memory, 4 * kMiB, 0, kScratchSeed), std::nullopt);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      files.push_back(e.path().string());
    }
    ASSERT_EQ(files.size(), 1u);
    const std::vector<unsigned char> bytes = read_file(files[0]);
    ASSERT_EQ(bytes.size(), 16 * kMiB);
    for (std::size_t slot = 0; slot < 4; ++slot) {
      EXPECT_EQ(std::memcmp(bytes.data() + slot * 4 * kMiB, memory, 4 * kMiB), 0)
          << "slot " << slot;
    }
  }
  EXPECT_GT(fake->copies(), 0u);
  EXPECT_EQ(fake->misuse(), 0u);
  EXPECT_EQ(fake->live_objects(), 0u);
}

TEST(TuneDevice, ReadTrialsLandInTheDeviceMemory) {
  TempDir dir;
  ScopedFakeDevice fake;
  {
    // Trials walk the file's four trial-sized slots in turn and read-only trials never write, so
    // the device memory ends up holding the slot of the last trial.
    unsigned char* memory = fake->alloc(4 * kMiB, 0);
    nvio::TuneRequest req = device_request(dir.path(), memory, 4 * kMiB);
    req.space.gpu_direct = {GpuDirect::Off};
    req.settings.modes = {TuneMode::Read};
    const nvio::TuneResult r = nvio::tune_directory(req);
    ASSERT_TRUE(r.read);
    EXPECT_FALSE(r.gpu_direct_searched);
    std::size_t trials = 0;
    for (const nvio::TunePoint& p : r.points) trials += p.samples.size();
    EXPECT_GE(fake->copies(), device_copies(r)) << "every trial moves the device memory";
    const std::uint64_t last_slot = (trials - 1) % 4;
    ASSERT_NE(last_slot, 0u) << "slot 0 is also what the device memory was filled with first";
    EXPECT_EQ(nvio::pattern::first_mismatch(memory, 4 * kMiB, last_slot * 4 * kMiB, kScratchSeed),
              std::nullopt)
        << trials << " trials";
  }
  EXPECT_GT(fake->copies(), 0u);
  EXPECT_EQ(fake->misuse(), 0u);
}

TEST(TuneDevice, BadDeviceMemoryIsRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  ScopedFakeDevice fake;
  unsigned char* memory = fake->alloc(kMiB);
  nvio::TuneRequest req = device_request(dir.path(), memory, kMiB);
  try {
    nvio::tune_directory(req);  // 4 MiB trials in 1 MiB of device memory
    FAIL() << "no error";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "larger than the device memory")) << e.what();
  }
  req.device_memory = nvio::TuneDeviceMemory{memory, 0};
  EXPECT_THROW(nvio::tune_directory(req), nvio::InvalidArgument);
  req.device_memory.reset();
  try {
    nvio::tune_directory(req);  // gpu_direct on, host memory
    FAIL() << "no error";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "needs device memory")) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_EQ(fake->copies(), 0u);
}

TEST(TuneDevice, AutomaticTrialsFitTheDeviceMemory) {
  EXPECT_EQ(nvio::max_auto_trial_bytes(16 * kMiB), 16 * kMiB);
  EXPECT_EQ(nvio::max_auto_trial_bytes(64 * kMiB), 32 * kMiB);
  EXPECT_EQ(nvio::max_auto_trial_bytes(std::uint64_t{1} << 30), std::uint64_t{256} * kMiB);
  TempDir dir;
  ScopedFakeDevice fake;
  unsigned char* memory = fake->alloc(2 * kMiB);
  nvio::TuneRequest req = device_request(dir.path(), memory, 2 * kMiB);
  req.trial_bytes = 0;
  req.space.gpu_direct = {GpuDirect::Off};
  req.space.parallelism = {1};
  req.settings.modes = {TuneMode::Read};
  const nvio::TuneResult r = nvio::tune_directory(req);
  EXPECT_EQ(r.trial_bytes, 2 * kMiB);
}

}  // namespace
}  // namespace nvio_test
