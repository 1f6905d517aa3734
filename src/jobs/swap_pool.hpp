// The swapper's memory: a pool of locked host buffers and the byte budget that bounds it together
// with the caller memory pinned by write-behind. Internal to the library (src/jobs/swapper.cpp).
//
// held = charged (write-behind bytes) + mapped (every slab and large buffer the pool has mapped,
// in use or kept free for reuse) and never exceeds the budget: an allocation or charge that does
// not fit after dropping the free memory fails (returns null / false) and the swapper decides
// whether to wait or throw. Buffers of at most kSlabMax bytes are slots of 64 KiB slabs (one size
// class per slab, powers of two from 16 bytes); larger ones are AlignedBuffers of their own.
//
// Thread-safety: every member may be called from any thread (one internal mutex). SwapBuffers hold
// a shared_ptr to the pool, so they may outlive the swapper; destroying one returns its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "nvio/memory.hpp"
#include "nvio/swapper.hpp"

namespace nvio::detail {

class SwapPool : public std::enable_shared_from_this<SwapPool> {
 public:
  static constexpr std::size_t kSlabSize = 64 * 1024;
  static constexpr std::size_t kSlabMax = 2048;

  SwapPool(std::uint64_t budget, LockMode lock) : budget_(budget), lock_(lock) {}

  // The most a buffer of `size` bytes can add to `mapped` (a new slab, or its own mapping).
  static std::uint64_t footprint(std::size_t size) noexcept;

  // A buffer of `size` bytes (>= 1), or null when the budget has no room for it even after the
  // free memory was dropped. Throws MemoryError when mapping fails.
  std::shared_ptr<SwapBuffer> try_allocate(std::size_t size);
  // Charges / uncharges write-behind bytes; try_charge fails as try_allocate does.
  bool try_charge(std::uint64_t bytes);
  void uncharge(std::uint64_t bytes) noexcept;
  // True when [p, p + size) lies in a buffer this pool has lent (already counted in `mapped`).
  bool owns(const void* p, std::size_t size) const noexcept;

  std::uint64_t budget() const noexcept { return budget_; }
  std::uint64_t held() const noexcept;
  std::uint64_t charged() const noexcept;
  std::uint64_t mapped() const noexcept;
  std::uint64_t free_bytes() const noexcept;  // mapped but not in use

 private:
  class Lent;
  struct Slab {
    AlignedBuffer memory;
    std::size_t slot_size = 0;
    std::vector<std::uint32_t> free_slots;
    std::uint32_t used = 0;
  };

  bool fits(std::uint64_t bytes) const noexcept { return charged_ + mapped_ + bytes <= budget_; }
  void drop_free_locked() noexcept;
  void release(Slab* slab, void* p, AlignedBuffer large) noexcept;
  static std::uint64_t mapping_size(std::size_t size) noexcept;

  const std::uint64_t budget_;
  const LockMode lock_;
  mutable std::mutex mutex_;
  std::uint64_t charged_ = 0;
  std::uint64_t mapped_ = 0;
  std::uint64_t free_ = 0;
  // Slabs by slot size; each slab lives in exactly one list.
  std::map<std::size_t, std::vector<std::unique_ptr<Slab>>> slabs_;
  // Large buffers kept for reuse, by mapping size.
  std::multimap<std::uint64_t, AlignedBuffer> free_large_;
  // Every lent buffer's range [start, end), for owns(): start -> end.
  std::map<std::uintptr_t, std::uintptr_t> lent_;
};

}  // namespace nvio::detail
