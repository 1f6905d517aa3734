// The tuner's search: where the measurements go. See include/nvio/tune.hpp for the outline.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <thread>

#include "nvio/errors.hpp"
#include "nvio/system.hpp"
#include "nvio/tune.hpp"

namespace nvio {

const char* to_string(TuneMode mode) noexcept { return mode == TuneMode::Read ? "read" : "write"; }

const char* to_string(TuneStrategy strategy) noexcept {
  return strategy == TuneStrategy::Search ? "search" : "grid";
}

double TunePoint::median_gbps() const {
  std::vector<double> v;
  for (const TuneSample& s : samples) v.push_back(s.gbps);
  return median(std::move(v));
}

double TunePoint::spread() const {
  if (samples.size() < 2) return 0;
  double lo = std::numeric_limits<double>::max();
  double hi = 0;
  for (const TuneSample& s : samples) {
    lo = std::min(lo, s.gbps);
    hi = std::max(hi, s.gbps);
  }
  const double m = median_gbps();
  return m > 0 ? (hi - lo) / m : 0;
}

double TunePoint::cpu_seconds_per_gb() const {
  double cpu = 0;
  double bytes = 0;
  for (const TuneSample& s : samples) {
    cpu += s.cpu_seconds;
    bytes += s.bytes;
  }
  return bytes > 0 ? cpu / (bytes / 1e9) : 0;
}

Options TuneResult::recommended() const {
  if (mixed) return mixed->options;
  if (read) return read->options;
  if (write) return write->options;
  throw InvalidArgument("the tuning result holds no measurement to recommend");
}

TuneSpace TuneSpace::defaults() {
  TuneSpace s;
  for (EngineKind k : {EngineKind::IoUring, EngineKind::Libaio, EngineKind::Psync}) {
    if (probe_engine(k).available) s.engines.push_back(k);
  }
  for (std::size_t b = std::size_t{128} << 10; b <= std::size_t{16} << 20; b *= 2) {
    s.block_sizes.push_back(b);
  }
  for (unsigned q = 1; q <= 256; q *= 2) s.queue_depths.push_back(q);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned p = 1; p <= std::min(2 * cpus, kMaxParallelism); p *= 2) s.parallelism.push_back(p);
  return s;
}

void TuneSpace::validate() const {
  auto nonempty = [](bool empty, const char* what) {
    if (empty) throw InvalidArgument(fmt::format("the tuning space has no {} to try", what));
  };
  nonempty(engines.empty(), "engines");
  nonempty(block_sizes.empty(), "block sizes");
  nonempty(queue_depths.empty(), "queue depths");
  nonempty(parallelism.empty(), "parallelism values");
  nonempty(single_submit.empty(), "single_submit values");
  nonempty(overlap_events.empty(), "overlap_events values");
  nonempty(direct.empty(), "direct I/O modes");
  nonempty(gpu_direct.empty(), "gpu_direct modes");
  for (EngineKind e : engines) {
    if (e == EngineKind::Auto || e == EngineKind::CuFile) {
      throw InvalidArgument(fmt::format(
          "the tuning space must name the handle's concrete engines (io_uring, libaio, psync), "
          "not {} (gpu_direct decides whether device memory goes through cuFile)",
          to_string(e)));
    }
  }
  for (DirectIo d : direct) {
    if (d == DirectIo::Auto)
      throw InvalidArgument("the tuning space's direct modes must be on or off");
  }
  for (GpuDirect g : gpu_direct) {
    if (g == GpuDirect::Auto)
      throw InvalidArgument("the tuning space's gpu_direct modes must be on or off");
  }
  // A value listed twice would be searched as two points that are one.
  auto unique = [](auto v, const char* what) {
    std::sort(v.begin(), v.end());
    if (std::adjacent_find(v.begin(), v.end()) != v.end()) {
      throw InvalidArgument(fmt::format("the tuning space lists a {} twice", what));
    }
  };
  unique(engines, "engine");
  unique(block_sizes, "block size");
  unique(queue_depths, "queue depth");
  unique(parallelism, "parallelism value");
  unique(single_submit, "single_submit value");
  unique(overlap_events, "overlap_events value");
  unique(direct, "direct I/O mode");
  unique(gpu_direct, "gpu_direct mode");
  Options probe;
  for (std::size_t b : block_sizes) {
    probe.block_size = b;
    probe.validate();
  }
  probe = Options{};
  for (unsigned q : queue_depths) {
    probe.queue_depth = q;
    probe.validate();
  }
  probe = Options{};
  for (unsigned p : parallelism) {
    probe.intra_op_parallelism = p;
    probe.validate();
  }
}

namespace {

// A point of the space as indices into its dimensions.
enum Dim { kEngine, kDirect, kBlock, kQueue, kPar, kSingle, kOverlap, kGpuDirect, kDims };
using Coord = std::array<int, kDims>;

struct Space {
  const TuneSpace& s;

  int size(int dim) const {
    switch (dim) {
      case kEngine: return static_cast<int>(s.engines.size());
      case kDirect: return static_cast<int>(s.direct.size());
      case kBlock: return static_cast<int>(s.block_sizes.size());
      case kQueue: return static_cast<int>(s.queue_depths.size());
      case kPar: return static_cast<int>(s.parallelism.size());
      case kSingle: return static_cast<int>(s.single_submit.size());
      case kOverlap: return static_cast<int>(s.overlap_events.size());
      case kGpuDirect: return static_cast<int>(s.gpu_direct.size());
    }
    return 0;
  }

  template <typename T>
  static int index_of(const std::vector<T>& v, const T& value) {
    const auto it = std::find(v.begin(), v.end(), value);
    return it == v.end() ? 0 : static_cast<int>(it - v.begin());
  }

  template <typename T>
  static int nearest(const std::vector<T>& v, double target) {
    int best = 0;
    for (int i = 0; i < static_cast<int>(v.size()); ++i) {
      const double d = std::abs(std::log2(double(v[i])) - std::log2(target));
      const double bd = std::abs(std::log2(double(v[best])) - std::log2(target));
      if (d < bd) best = i;
    }
    return best;
  }

  // psync runs each request to completion on the worker thread: queue depth and the submission
  // and reaping policies change nothing, so they are held at one value for it. cuFile
  // (gpu_direct on) does the same in place of the engine, on the O_DIRECT descriptor: the engine
  // and direct are held too.
  Coord canon(Coord c) const {
    const bool cufile = s.gpu_direct[c[kGpuDirect]] == GpuDirect::On;
    if (cufile) {
      c[kEngine] = 0;
      c[kDirect] = index_of(s.direct, DirectIo::On);
    }
    if (cufile || s.engines[c[kEngine]] == EngineKind::Psync) {
      c[kQueue] = 0;
      c[kSingle] = index_of(s.single_submit, false);
      c[kOverlap] = index_of(s.overlap_events, true);
    }
    return c;
  }

  Options options(const Coord& c) const {
    Options o;
    o.engine = s.engines[c[kEngine]];
    o.direct = s.direct[c[kDirect]];
    o.block_size = s.block_sizes[c[kBlock]];
    o.queue_depth = s.queue_depths[c[kQueue]];
    o.intra_op_parallelism = s.parallelism[c[kPar]];
    o.single_submit = s.single_submit[c[kSingle]];
    o.overlap_events = s.overlap_events[c[kOverlap]];
    o.gpu_direct = s.gpu_direct[c[kGpuDirect]];
    return o;
  }

  // Middling settings: where the seeds start.
  Coord seed(int engine, int direct, int gpu_direct) const {
    Coord c{};
    c[kEngine] = engine;
    c[kDirect] = direct;
    c[kGpuDirect] = gpu_direct;
    c[kBlock] = nearest(s.block_sizes, double(1 << 20));
    c[kQueue] = nearest(s.queue_depths, 32.0);
    c[kPar] = 0;
    c[kSingle] = index_of(s.single_submit, false);
    c[kOverlap] = index_of(s.overlap_events, true);
    return canon(c);
  }

  // The points one move away: ordinal dimensions by `step` indices (parallelism by one), the
  // others switched to each other value.
  std::vector<Coord> neighbours(const Coord& c, int step) const {
    std::vector<Coord> out;
    auto add = [&](Coord n) {
      n = canon(n);
      if (n != c && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    };
    for (int dim = 0; dim < kDims; ++dim) {
      const bool ordinal = dim == kBlock || dim == kQueue || dim == kPar;
      if (ordinal) {
        const int d = dim == kPar ? 1 : step;
        for (int delta : {-d, d}) {
          const int i = c[dim] + delta;
          if (i >= 0 && i < size(dim)) {
            Coord n = c;
            n[dim] = i;
            add(n);
          }
        }
      } else {
        for (int i = 0; i < size(dim); ++i) {
          if (i == c[dim]) continue;
          Coord n = c;
          n[dim] = i;
          add(n);
        }
      }
    }
    return out;
  }

  std::vector<Coord> all() const {
    std::vector<Coord> out;
    Coord c{};
    // Odometer over every dimension; canon() folds the ones psync ignores.
    while (true) {
      const Coord k = canon(c);
      if (k == c) out.push_back(c);
      int dim = kDims - 1;
      while (dim >= 0 && ++c[dim] == size(dim)) c[dim--] = 0;
      if (dim < 0) break;
    }
    return out;
  }
};

class Searcher {
 public:
  Searcher(const TuneSpace& space, Measurer& m, const TuneSettings& settings, TuneResult& result)
      : space_{space}, m_(m), settings_(settings), result_(result) {}

  void run() {
    const double start = m_.now();
    const double budget = settings_.strategy == TuneStrategy::Grid
                              ? std::numeric_limits<double>::infinity()
                              : settings_.budget_s;
    const std::size_t modes = settings_.modes.size();
    const double cross_share = modes > 1 ? 0.1 * (budget - start) : 0;
    for (std::size_t i = 0; i < modes; ++i) {
      const TuneMode mode = settings_.modes[i];
      // Time a mode leaves unused (its last trial did not fit) goes to the next one.
      const double now = m_.now();
      const double end = now + (budget - cross_share - now) / double(modes - i);
      if (settings_.strategy == TuneStrategy::Grid) {
        grid(mode);
      } else {
        search_mode(mode, end);
      }
    }
    if (modes > 1) cross(budget);
    finish();
  }

 private:
  using Key = std::pair<TuneMode, Coord>;

  TunePoint* find(TuneMode mode, const Coord& c) {
    const auto it = index_.find(Key{mode, c});
    return it == index_.end() ? nullptr : &result_.points[it->second];
  }

  std::size_t samples(TuneMode mode, const Coord& c) {
    const TunePoint* p = find(mode, c);
    return p == nullptr ? 0 : p->samples.size();
  }

  double value(TuneMode mode, const Coord& c) {
    const TunePoint* p = find(mode, c);
    return p == nullptr ? 0 : p->median_gbps();
  }

  // Typical trial length so far, to decide whether one more fits before a deadline.
  double trial_estimate(TuneMode mode, const Coord& c) {
    if (const TunePoint* p = find(mode, c); p != nullptr && !p->samples.empty()) {
      const TuneSample& s = p->samples.back();
      return s.gbps > 0 ? s.bytes / (s.gbps * 1e9) : 0;
    }
    return durations_.empty() ? 0 : median(durations_);
  }

  // Takes one more sample of `c` in `mode` if it fits before `deadline`; false when it does not.
  // The first sample of a mode is always taken, so that even a budget eaten by the setup yields
  // a (rough) answer.
  bool sample(TuneMode mode, const Coord& c, double deadline, const char* phase) {
    const bool first =
        std::none_of(coords_.begin(), coords_.end(), [&](const Key& k) { return k.first == mode; });
    if (!first && m_.now() + trial_estimate(mode, c) > deadline) return false;
    const TuneSample s = m_.measure(space_.options(c), mode);
    auto it = index_.find(Key{mode, c});
    if (it == index_.end()) {
      TunePoint p;
      p.mode = mode;
      p.options = space_.options(c);
      result_.points.push_back(std::move(p));
      it = index_.emplace(Key{mode, c}, result_.points.size() - 1).first;
      coords_.push_back(Key{mode, c});
    }
    result_.points[it->second].samples.push_back(s);
    if (s.gbps > 0) durations_.push_back(s.bytes / (s.gbps * 1e9));
    report(mode, phase);
    return true;
  }

  void report(TuneMode mode, const char* phase) {
    if (!settings_.progress) return;
    TuneProgress p;
    p.elapsed_s = m_.now();
    p.budget_s = settings_.strategy == TuneStrategy::Grid ? 0 : settings_.budget_s;
    p.mode = mode;
    p.phase = phase;
    p.points = result_.points.size();
    p.best = pick(mode);
    settings_.progress(p);
  }

  // Relative measurement noise: half the typical spread of points measured more than once. Moves
  // smaller than this are not trusted.
  double noise() const {
    std::vector<double> spreads;
    for (const TunePoint& p : result_.points) {
      if (p.samples.size() >= 2) spreads.push_back(p.spread() / 2);
    }
    if (spreads.size() < 2) return 0.03;
    return std::clamp(median(spreads), 0.01, 0.25);
  }

  std::vector<Coord> ranked(TuneMode mode) {
    std::vector<Coord> out;
    for (const Key& k : coords_) {
      if (k.first == mode) out.push_back(k.second);
    }
    std::stable_sort(out.begin(), out.end(), [&](const Coord& a, const Coord& b) {
      return value(mode, a) > value(mode, b);
    });
    return out;
  }

  void search_mode(TuneMode mode, double end) {
    const double begin = m_.now();
    const double climb_end = begin + 0.7 * (end - begin);
    std::vector<Coord> seeds;
    for (int g = 0; g < space_.size(kGpuDirect); ++g) {
      for (int e = 0; e < space_.size(kEngine); ++e) {
        for (int d = 0; d < space_.size(kDirect); ++d) {
          // cuFile seeds fold into one (it holds the engine and direct).
          const Coord c = space_.seed(e, d, g);
          if (std::find(seeds.begin(), seeds.end(), c) == seeds.end()) seeds.push_back(c);
        }
      }
    }
    for (const Coord& c : seeds) {
      if (!sample(mode, c, climb_end, "seed")) break;
    }
    std::stable_sort(seeds.begin(), seeds.end(), [&](const Coord& a, const Coord& b) {
      return value(mode, a) > value(mode, b);
    });
    // Climb from the best seed, then from any other seed nearly as good (another basin).
    const double best_seed = seeds.empty() ? 0 : value(mode, seeds.front());
    for (std::size_t i = 0; i < seeds.size(); ++i) {
      if (samples(mode, seeds[i]) == 0) break;
      if (i > 0 && value(mode, seeds[i]) < 0.8 * best_seed) break;
      if (!climb(mode, seeds[i], climb_end)) break;
    }
    confirm(mode, end);
    refine(mode, end);
  }

  // Hill climbing from `c`; false when the deadline cut it short.
  bool climb(TuneMode mode, Coord c, double deadline) {
    int step = 2;
    while (true) {
      const std::vector<Coord> around = space_.neighbours(c, step);
      for (const Coord& n : around) {
        if (samples(mode, n) == 0 && !sample(mode, n, deadline, "climb")) return false;
      }
      Coord best = c;
      for (const Coord& n : around) {
        if (value(mode, n) > value(mode, best)) best = n;
      }
      const double margin = 1 + noise();
      if (best != c && value(mode, best) > value(mode, c) * margin) {
        // A close call on single samples: measure both again before moving.
        if (value(mode, best) < value(mode, c) * (1 + 3 * noise()) && samples(mode, best) < 2) {
          if (!sample(mode, best, deadline, "climb") || !sample(mode, c, deadline, "climb")) {
            return false;
          }
          if (value(mode, best) <= value(mode, c) * margin) {
            if (step == 1) return true;
            step = 1;
            continue;
          }
        }
        c = best;
        continue;
      }
      if (step == 1) return true;
      step = 1;
    }
  }

  // Successive halving over the best few points: repeats, then keep the better half.
  void confirm(TuneMode mode, double end) {
    std::vector<Coord> field = ranked(mode);
    if (field.size() > 6) field.resize(6);
    std::size_t repeats = 2;
    while (field.size() > 1) {
      for (const Coord& c : field) {
        while (samples(mode, c) < repeats) {
          if (!sample(mode, c, end, "confirm")) return;
        }
      }
      std::stable_sort(field.begin(), field.end(), [&](const Coord& a, const Coord& b) {
        return value(mode, a) > value(mode, b);
      });
      field.resize((field.size() + 1) / 2);
      repeats += 1;
    }
  }

  // Spends what is left of the share: the leader gets at least three samples, then unmeasured
  // neighbours of the best points are tried, then the leaders' repeats are added to.
  void refine(TuneMode mode, double end) {
    while (true) {
      const std::vector<Coord> order = ranked(mode);
      if (order.empty()) return;
      const Coord& leader = order.front();
      if (samples(mode, leader) < 3) {
        if (!sample(mode, leader, end, "confirm")) return;
        continue;
      }
      bool tried = false;
      for (std::size_t i = 0; i < std::min<std::size_t>(3, order.size()) && !tried; ++i) {
        for (const Coord& n : space_.neighbours(order[i], 1)) {
          if (samples(mode, n) == 0) {
            if (!sample(mode, n, end, "refine")) return;
            tried = true;
            break;
          }
        }
      }
      if (tried) continue;
      Coord fewest = leader;
      for (std::size_t i = 1; i < std::min<std::size_t>(3, order.size()); ++i) {
        if (samples(mode, order[i]) < samples(mode, fewest)) fewest = order[i];
      }
      if (!sample(mode, fewest, end, "confirm")) return;
    }
  }

  void grid(TuneMode mode) {
    const double unlimited = std::numeric_limits<double>::infinity();
    for (const Coord& c : space_.all()) sample(mode, c, unlimited, "grid");
    confirm(mode, unlimited);
  }

  // Measures the best points of each mode in the other, so that the mixed pick has candidates.
  void cross(double end) {
    const TuneMode a = settings_.modes[0];
    const TuneMode b = settings_.modes[1];
    std::vector<Coord> todo;
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      const std::vector<Coord> order = ranked(from);
      for (std::size_t i = 0; i < std::min<std::size_t>(3, order.size()); ++i) {
        todo.push_back(order[i]);
      }
    }
    for (int round = 0; round < 2; ++round) {
      for (const Coord& c : todo) {
        for (TuneMode mode : {a, b}) {
          if (samples(mode, c) <= static_cast<std::size_t>(round) &&
              !sample(mode, c, end, "cross")) {
            return;
          }
        }
      }
    }
    // What is left goes to more repeats of the candidates, the least measured first. The grid has
    // no budget, so nothing is left: without this its run would never end.
    if (!std::isfinite(end)) return;
    while (true) {
      const Coord* fewest = nullptr;
      TuneMode fewest_mode = a;
      for (const Coord& c : todo) {
        for (TuneMode mode : {a, b}) {
          if (fewest == nullptr || samples(mode, c) < samples(fewest_mode, *fewest)) {
            fewest = &c;
            fewest_mode = mode;
          }
        }
      }
      if (fewest == nullptr || !sample(fewest_mode, *fewest, end, "cross")) return;
    }
  }

  std::optional<TunePick> pick(TuneMode mode) {
    // Prefer points measured at least three times: a single lucky sample should not win.
    std::size_t most = 0;
    for (const Key& k : coords_) {
      if (k.first == mode) most = std::max(most, samples(mode, k.second));
    }
    const std::size_t need = std::min<std::size_t>(3, most);
    const TunePoint* best = nullptr;
    const TunePoint* second = nullptr;
    for (const Key& k : coords_) {
      if (k.first != mode) continue;
      const TunePoint* p = find(mode, k.second);
      if (p->samples.size() < need) continue;
      if (best == nullptr || p->median_gbps() > best->median_gbps()) {
        second = best;
        best = p;
      } else if (second == nullptr || p->median_gbps() > second->median_gbps()) {
        second = p;
      }
    }
    if (best == nullptr) return std::nullopt;
    TunePick out;
    out.options = best->options;
    out.gbps = best->median_gbps();
    out.spread = best->spread();
    out.repeats = best->samples.size();
    out.cpu_seconds_per_gb = best->cpu_seconds_per_gb();
    out.runner_up_gbps = second == nullptr ? 0 : second->median_gbps();
    return out;
  }

  void finish() {
    for (TuneMode mode : settings_.modes) {
      (mode == TuneMode::Read ? result_.read : result_.write) = pick(mode);
    }
    if (settings_.modes.size() > 1) {
      for (const Key& k : coords_) {
        if (k.first != TuneMode::Read) continue;
        const double r = value(TuneMode::Read, k.second);
        const double w = value(TuneMode::Write, k.second);
        if (r <= 0 || w <= 0) continue;
        const double h = 2 * r * w / (r + w);
        if (!result_.mixed || h > result_.mixed->mixed_gbps) {
          result_.mixed = MixedPick{space_.options(k.second), r, w, h};
        }
      }
    }
    result_.elapsed_s = m_.now();
  }

  Space space_;
  Measurer& m_;
  const TuneSettings& settings_;
  TuneResult& result_;
  std::map<Key, std::size_t> index_;
  std::vector<Key> coords_;  // in the order first measured
  std::vector<double> durations_;
};

}  // namespace

std::vector<Options> TuneSpace::all() const {
  validate();
  std::vector<Options> out;
  const Space s{*this};
  for (const Coord& c : s.all()) out.push_back(s.options(c));
  return out;
}

TuneResult search(const TuneSpace& space, Measurer& measurer, const TuneSettings& settings) {
  space.validate();
  if (settings.modes.empty() || settings.modes.size() > 2 ||
      (settings.modes.size() == 2 && settings.modes[0] == settings.modes[1])) {
    throw InvalidArgument("tuning needs read, write, or both modes, each once");
  }
  if (settings.strategy == TuneStrategy::Search &&
      (!std::isfinite(settings.budget_s) || settings.budget_s <= 0)) {
    throw InvalidArgument(fmt::format(
        "the tuning budget must be a positive number of seconds, got {}", settings.budget_s));
  }
  TuneResult result;
  result.strategy = settings.strategy;
  result.budget_s = settings.strategy == TuneStrategy::Grid ? 0 : settings.budget_s;
  result.modes = settings.modes;
  result.gpu_direct_searched = space.gpu_direct.size() > 1;
  Searcher(space, measurer, settings, result).run();
  return result;
}

}  // namespace nvio
