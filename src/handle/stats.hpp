// The counters behind Handle::stats(): a shard of relaxed atomic counters per worker, and one for
// the other threads (a submitter finishing an operation that never reached a worker), summed when
// read: no lock and no shared cache line on the hot path. Internal to the library.
//
// Each fact is counted where it happens, for every engine alike: a piece's transfer in the worker
// (handle/worker.cpp), an operation's outcome where its last piece finishes (operation.cpp).
//
// Thread-safety: a shard's add() and failed() may be called from any thread (a worker's shard is
// written by that worker only, the others' shard by any thread); snapshot() from any thread at any
// time, summing each counter with a relaxed load (see Handle::stats() for what that means).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>

#include "nvio/handle.hpp"

namespace nvio::detail {

// One per field of HandleStats but `errors`, in the order of handle_stats_fields().
enum class Counter : unsigned {
  Reads,
  Writes,
  BytesRead,
  BytesWritten,
  Pieces,
  Retries,
  ShortTransfers,
  BouncedBytes,
  EdgeBytes,
  GdsBytes,
  DeviceBounceBytes,
  ShiftedBytes,
  CachedBytes,
};
inline constexpr std::size_t kCounterCount = 13;

// The errno of a failed operation's error, as HandleStats::errors counts it.
int error_errno(const std::exception_ptr& error) noexcept;

// Errno values counted apart; larger ones count under the last.
inline constexpr std::size_t kErrnoSlots = 256;

// One thread's counters (or the other threads'), on cache lines of their own (128 bytes:
// adjacent-line prefetch), so that workers counting never share one.
struct alignas(128) StatsShard {
  std::array<std::atomic<std::uint64_t>, kCounterCount> values{};
  std::array<std::atomic<std::uint64_t>, kErrnoSlots> errors{};  // failed operations by errno

  void add(Counter c, std::uint64_t n) noexcept {
    values[static_cast<std::size_t>(c)].fetch_add(n, std::memory_order_relaxed);
  }
  // An operation failed with `error`.
  void failed(const std::exception_ptr& error) noexcept;
};

// A handle's shards.
class HandleCounters {
 public:
  // Shards for `workers` worker threads. Called once, before any worker starts.
  void set_workers(unsigned workers);
  // Worker `index`'s shard.
  StatsShard& worker(unsigned index) noexcept { return shards_[index]; }
  // The shard of any other thread.
  StatsShard& others() noexcept { return shards_[workers_]; }
  HandleStats snapshot() const;

 private:
  unsigned workers_ = 0;
  std::unique_ptr<StatsShard[]> shards_ = std::make_unique<StatsShard[]>(1);
};

}  // namespace nvio::detail
