// measure_striped: several drives measured together through a StripedHandle (see nvio/tune.hpp).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/posix.hpp"
#include "nvio/errors.hpp"
#include "nvio/memory.hpp"
#include "nvio/pattern.hpp"
#include "nvio/stripe.hpp"
#include "nvio/tune.hpp"

namespace nvio {

namespace {

constexpr std::uint64_t kStripedSeed = 0x5354'5250;

// Removes the striped scratch file however the measurement ends.
class StripedScratch {
 public:
  StripedScratch(StripedHandle& h, std::string name) : h_(h), name_(std::move(name)) {}
  ~StripedScratch() {
    try {
      h_.remove(name_);
    } catch (const Error&) {  // NOLINT(bugprone-empty-catch): a leftover file is not worth a throw
    }
  }
  StripedScratch(const StripedScratch&) = delete;
  StripedScratch& operator=(const StripedScratch&) = delete;
  const std::string& name() const { return name_; }

 private:
  StripedHandle& h_;
  std::string name_;
};

}  // namespace

StripedTuneResult measure_striped(const StripedTuneRequest& request) {
  if (request.repeats == 0) throw InvalidArgument("measure_striped: repeats must be at least 1");
  if (request.file_size == 0) throw InvalidArgument("measure_striped: file_size must be positive");
  if (request.modes.empty()) throw InvalidArgument("measure_striped: no mode to measure");
  StripedHandle h(StripeLayout{request.directories, request.stripe_size}, request.options);
  StripedScratch scratch(h, fmt::format("nvio-tune-striped-{}.dat", ::getpid()));
  const std::size_t drives = request.directories.size();
  // The file moves in chunks through one buffer of at most chunk_bytes (a --size of 64G must not
  // ask for 64 GiB of memory), each chunk whole rows of stripes so that every drive gets its share.
  const std::uint64_t row = std::uint64_t{request.stripe_size} * drives;
  const std::uint64_t chunk =
      std::min(request.file_size, std::max(row, request.chunk_bytes / row * row));
  AlignedBuffer buf(static_cast<std::size_t>(chunk), LockMode::Try);
  const WriteOptions durable{Truncate::No, Durability::Data, MemoryKind::Host};
  const StripeLayout& layout = h.layout();
  // One pass over the file; returns the seconds of the whole and of each drive (the sums over the
  // chunks of each call's time until its last byte, and each drive's time until its own).
  auto pass = [&](TuneMode mode, bool verify, std::vector<double>& drive_seconds) {
    double seconds = 0;
    for (std::uint64_t off = 0; off < request.file_size; off += chunk) {
      const auto len = static_cast<std::size_t>(std::min(chunk, request.file_size - off));
      StripedTransfer t;
      if (mode == TuneMode::Write) {
        pattern::fill(buf.data(), len, off, kStripedSeed);
        t = h.write(buf.data(), len, scratch.name(), off, durable);
      } else {
        t = h.read(buf.data(), len, scratch.name(), off);
        if (verify) {
          if (auto bad = pattern::first_mismatch(buf.data(), len, off, kStripedSeed)) {
            throw FormatError(
                scratch.name(),
                fmt::format("the striped tune file read back wrong at offset {}", *bad));
          }
        }
      }
      seconds += t.seconds;
      for (std::size_t d = 0; d < drives; ++d) drive_seconds[d] += t.drives[d].seconds;
    }
    return seconds;
  };
  std::vector<double> unused(drives);
  // Reads need the file: written once, untimed, when no write is measured first.
  if (std::ranges::find(request.modes, TuneMode::Write) == request.modes.end()) {
    pass(TuneMode::Write, false, unused);
  }
  StripedTuneResult out;
  out.directories = request.directories;
  out.stripe_size = request.stripe_size;
  out.file_size = request.file_size;
  // Writes first, so that the reads find the file.
  std::vector<TuneMode> order = request.modes;
  std::ranges::sort(order, [](TuneMode a, TuneMode b) { return a == TuneMode::Write && b != a; });
  for (TuneMode mode : order) {
    StripedModeResult m;
    m.mode = mode;
    std::vector<std::vector<double>> per_drive(drives);
    for (unsigned i = 0; i < request.repeats; ++i) {
      if (mode == TuneMode::Read) {
        for (std::size_t d = 0; d < drives; ++d) {
          detail::evict_page_cache(h.part_path(d, scratch.name()));
        }
      }
      std::vector<double> drive_seconds(drives);
      const double seconds = pass(mode, /*verify=*/i == 0, drive_seconds);
      m.all_gbps.push_back(static_cast<double>(request.file_size) / std::max(seconds, 1e-9) / 1e9);
      for (std::size_t d = 0; d < drives; ++d) {
        const auto bytes = static_cast<double>(layout.part_size(d, request.file_size));
        per_drive[d].push_back(bytes / std::max(drive_seconds[d], 1e-9) / 1e9);
      }
    }
    m.gbps = median(m.all_gbps);
    for (auto& v : per_drive) m.drive_gbps.push_back(median(std::move(v)));
    out.modes.push_back(std::move(m));
  }
  return out;
}

std::string to_json(const StripedTuneResult& result, int indent) {
  nlohmann::json modes = nlohmann::json::array();
  for (const StripedModeResult& m : result.modes) {
    modes.push_back({{"mode", to_string(m.mode)},
                     {"gb_per_s", m.gbps},
                     {"gb_per_s_all", m.all_gbps},
                     {"drive_gb_per_s", m.drive_gbps}});
  }
  const nlohmann::json doc = {{"directories", result.directories},
                              {"stripe_size", result.stripe_size},
                              {"file_size", result.file_size},
                              {"modes", modes}};
  return doc.dump(indent);
}

}  // namespace nvio
