// Cached reads: a read whose bytes are already in the page cache (a file just written, or read
// before) is taken through the page cache, the rest of it direct. A direct read ignores cached
// pages (and makes the kernel write back dirty ones first) and fetches the bytes from the drive
// again: a cached file read direct runs at the drive's speed, through the page cache at memory
// speed. Internal to the library.
//
// The decision is made once per read request, when it is planned (Handle::Impl::prepare_op): one
// cachestat(2) of its range, and only where that finds part of it cached, a mincore(2) map of the
// range to pick the pieces that are. Direct reads of the rest keep their planned pieces, so a
// cold file reads as before at the cost of one system call per request. The probe may be stale by
// the time a piece runs (pages evicted or brought in meanwhile): either way the bytes read are
// the file's; only the speed differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "handle/plan.hpp"
#include "nvio/options.hpp"

namespace nvio::detail {

struct Operation;

// What planning found of one read in the page cache. Filled by the submitting thread before the
// operation is queued, read-only afterwards.
struct CachedRanges {
  bool whole = false;   // every byte was cached: the read is planned buffered as a whole
  bool partly = false;  // some bytes were cached: mark_cached_pieces looks closer
  // Otherwise, per middle piece of the plan (Plan::middle_pieces(), in file order): whether every
  // page of it was cached, so that it goes through the buffered descriptor. Empty: none.
  std::vector<bool> middle;

  // Whether the piece at `file_offset` of `plan` is read from the page cache by this decision.
  bool holds(const Plan& plan, std::uint64_t file_offset) const noexcept;
};

// How residency is looked at; the fallback is what kernels before 6.5 (no cachestat) and overlayfs
// take. Process-wide, for tests of the fallback.
enum class ResidencyProbe { Cachestat, Mincore };
// Sets the probe and returns the previous one. Thread-safe.
ResidencyProbe set_residency_probe_for_testing(ResidencyProbe probe) noexcept;

// Reads shorter than this are not probed: for a small read the probe would be a second system
// call as dear as the read itself.
inline constexpr std::size_t kMinProbedRead = 64 * 1024;

// Whether to plan `op` buffered as a whole: a host-memory read of at least kMinProbedRead bytes,
// with both descriptors, under direct=auto and cached_reads=auto, whose range is entirely in the
// page cache (op.cached.whole is set then). Returns false, looking at nothing, for any other
// operation. Where only part is cached, remembers that for mark_cached_pieces. Never throws for a
// failed probe: the read then goes direct, as planned.
bool plan_cached_whole(Operation& op, DirectIo direct, CachedReads cached_reads);

// After `op` was planned with direct I/O: marks the middle pieces that are in the page cache (all
// of their pages) to go through the buffered descriptor instead. Does nothing unless
// plan_cached_whole found the read partly cached.
void mark_cached_pieces(Operation& op);

}  // namespace nvio::detail
