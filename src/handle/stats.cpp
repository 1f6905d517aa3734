#include "handle/stats.hpp"

#include <algorithm>
#include <iterator>

#include "nvio/errors.hpp"

namespace nvio {

namespace {

constexpr HandleStatsField kFields[] = {
    {"reads", &HandleStats::reads, "read operations that succeeded"},
    {"writes", &HandleStats::writes, "write operations that succeeded"},
    {"bytes_read", &HandleStats::bytes_read, "bytes of the reads that succeeded"},
    {"bytes_written", &HandleStats::bytes_written, "bytes of the writes that succeeded"},
    {"pieces", &HandleStats::pieces, "pieces (block_size parts and unaligned edges) transferred"},
    {"retries", &HandleStats::retries,
     "requests offered again without a byte moving (EINTR, EAGAIN, no aligned progress)"},
    {"short_transfers", &HandleStats::short_transfers,
     "completions that moved fewer bytes than asked, resumed"},
    {"bounced_bytes", &HandleStats::bounced_bytes,
     "host memory: direct bytes moved through aligned bounce buffers"},
    {"edge_bytes", &HandleStats::edge_bytes,
     "unaligned head and tail bytes moved through the buffered descriptor"},
    {"gds_bytes", &HandleStats::gds_bytes, "device memory: bytes moved through cuFile (GDS)"},
    {"device_bounce_bytes", &HandleStats::device_bounce_bytes,
     "device memory: bytes moved through host bounce chunks"},
    {"shifted_bytes", &HandleStats::shifted_bytes,
     "host memory: direct bytes of unaligned reads landed beside their place, then moved there"},
    {"cached_bytes", &HandleStats::cached_bytes,
     "read bytes found in the page cache and read through it (cached_reads=auto)"},
};
static_assert(std::size(kFields) == detail::kCounterCount);

}  // namespace

std::span<const HandleStatsField> handle_stats_fields() noexcept { return kFields; }

HandleStats& HandleStats::operator-=(const HandleStats& before) {
  for (const HandleStatsField& f : kFields) this->*f.member -= before.*f.member;
  for (const auto& [err, count] : before.errors) {
    auto it = errors.find(err);
    if (it == errors.end()) continue;
    it->second -= count;
    if (it->second == 0) errors.erase(it);
  }
  return *this;
}

HandleStats& HandleStats::operator+=(const HandleStats& other) {
  for (const HandleStatsField& f : kFields) this->*f.member += other.*f.member;
  for (const auto& [err, count] : other.errors) errors[err] += count;
  return *this;
}

namespace detail {

int error_errno(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const IoError& e) {
    return e.error_code();
  } catch (const MemoryError& e) {
    return e.error_code();
  } catch (...) {
    return 0;
  }
}

void StatsShard::failed(const std::exception_ptr& error) noexcept {
  const int err = error_errno(error);
  const std::size_t slot = err < 0 ? 0 : std::min(static_cast<std::size_t>(err), kErrnoSlots - 1);
  errors[slot].fetch_add(1, std::memory_order_relaxed);
}

void HandleCounters::set_workers(unsigned workers) {
  shards_ = std::make_unique<StatsShard[]>(std::size_t{workers} + 1);
  workers_ = workers;
}

HandleStats HandleCounters::snapshot() const {
  std::array<std::uint64_t, kCounterCount> values{};
  std::array<std::uint64_t, kErrnoSlots> errors{};
  for (unsigned s = 0; s <= workers_; ++s) {
    const StatsShard& shard = shards_[s];
    for (std::size_t i = 0; i < kCounterCount; ++i) {
      values[i] += shard.values[i].load(std::memory_order_relaxed);
    }
    for (std::size_t e = 0; e < kErrnoSlots; ++e) {
      errors[e] += shard.errors[e].load(std::memory_order_relaxed);
    }
  }
  HandleStats stats;
  for (std::size_t i = 0; i < kCounterCount; ++i) stats.*kFields[i].member = values[i];
  for (std::size_t e = 0; e < kErrnoSlots; ++e) {
    if (errors[e] != 0) stats.errors.emplace(static_cast<int>(e), errors[e]);
  }
  return stats;
}

}  // namespace detail
}  // namespace nvio
