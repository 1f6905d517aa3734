#include "handle/residency.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "core/posix.hpp"
#include "handle/operation.hpp"

namespace nvio::detail {
namespace {

std::atomic<ResidencyProbe> g_probe{ResidencyProbe::Cachestat};

constexpr std::uint64_t kPage = 4096;  // cachestat and mincore count 4 KiB pages here

std::uint64_t pages_of(std::uint64_t offset, std::uint64_t length) {
  return (offset + length + kPage - 1) / kPage - offset / kPage;
}

enum class Seen { Cold, Partly, Whole };

Seen classify(std::uint64_t cached, std::uint64_t pages) {
  if (cached == 0) return Seen::Cold;
  return cached >= pages ? Seen::Whole : Seen::Partly;
}

// How much of [offset, offset + length) of `fd` is cached: cachestat, else (ENOSYS, or the probe
// forced for tests) a mincore map. Any failure counts as cold: the read goes direct, as planned.
Seen look(int fd, std::uint64_t offset, std::uint64_t length) {
  const std::uint64_t pages = pages_of(offset, length);
  if (g_probe.load(std::memory_order_relaxed) == ResidencyProbe::Cachestat) {
    CacheCounts counts;
    const int rc = cache_counts(fd, offset, length, counts);
    if (rc == 0) return classify(counts.cached_pages, pages);
    if (rc != -ENOSYS) return Seen::Cold;
  }
  std::vector<unsigned char> map;
  if (resident_map(fd, offset, length, map) != 0) return Seen::Cold;
  return classify(static_cast<std::uint64_t>(std::count(map.begin(), map.end(), 1)), pages);
}

}  // namespace

bool CachedRanges::holds(const Plan& plan, std::uint64_t file_offset) const noexcept {
  if (whole) return true;
  if (middle.empty() || file_offset < plan.head_end || file_offset >= plan.tail_begin) {
    return false;
  }
  return middle[static_cast<std::size_t>((file_offset - plan.head_end) / plan.piece_size)];
}

ResidencyProbe set_residency_probe_for_testing(ResidencyProbe probe) noexcept {
  return g_probe.exchange(probe);
}

bool plan_cached_whole(Operation& op, DirectIo direct, CachedReads cached_reads) {
  // direct=on asks for O_DIRECT whatever the page cache holds; device memory keeps its transports.
  if (cached_reads == CachedReads::Off || direct != DirectIo::Auto || !op.is_read() ||
      op.memory != MemoryKind::Host || op.length < kMinProbedRead || op.direct_fd < 0 ||
      op.buffered_fd < 0) {
    return false;
  }
  const Seen seen = look(op.buffered_fd, op.offset, op.length);
  op.cached.whole = seen == Seen::Whole;
  op.cached.partly = seen == Seen::Partly;
  return op.cached.whole;
}

void mark_cached_pieces(Operation& op) {
  if (!op.cached.partly || !op.plan.direct || op.plan.middle_pieces() == 0) return;
  const Plan& plan = op.plan;
  std::vector<unsigned char> map;
  if (resident_map(op.buffered_fd, plan.head_end, plan.tail_begin - plan.head_end, map) != 0) {
    return;  // read direct, as planned
  }
  // The middle starts on a page (its split alignment is at least one), so map[0] is its first.
  const std::uint64_t first_page = plan.head_end / kPage;
  std::vector<bool> middle(plan.middle_pieces(), false);
  bool any = false;
  for (std::size_t i = 0; i < middle.size(); ++i) {
    const Piece p = plan.piece(i + (plan.has_head() ? 1 : 0));
    const auto begin = static_cast<std::size_t>(p.file_offset / kPage - first_page);
    const auto end =
        static_cast<std::size_t>((p.file_offset + p.length + kPage - 1) / kPage - first_page);
    middle[i] = std::all_of(map.begin() + static_cast<std::ptrdiff_t>(begin),
                            map.begin() + static_cast<std::ptrdiff_t>(std::min(end, map.size())),
                            [](unsigned char v) { return v != 0; });
    any = any || middle[i];
  }
  if (any) op.cached.middle = std::move(middle);
}

}  // namespace nvio::detail
