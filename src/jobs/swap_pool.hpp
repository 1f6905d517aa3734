// The swapper's memory: a pool of locked host buffers and the byte budget that bounds it together
// with the caller memory pinned by write-behind. Internal to the library (src/jobs/swapper.cpp).
//
// held = charged (write-behind bytes) + mapped (every slab and large buffer the pool has mapped,
// in use or kept free for reuse) and never exceeds the budget: an allocation or charge that does
// not fit after dropping free memory fails (returns null / false) and the swapper decides
// whether to wait or throw. Buffers of at most kSlabMax bytes are slots of 64 KiB slabs (one size
// class per slab, powers of two from 16 bytes). Medium buffers, 256 KiB to 2 MiB, are slots of
// slabs of whole 2 MiB huge pages (size classes at most 1/8 above the size), made only while the
// unused slots of slabs in use stay within 1/8 of the budget and within keep_free (memory kept
// unused, which no drop can return while a slot is lent): a buffer of its own below 2 MiB gets
// 4 KiB pages scattered in physical memory, and an O_DIRECT read into 1 MiB of those carries 256
// segments, past a virtio disk's 254, so it went to the drive as two requests (swap_in of 1 MiB
// tensors ran at half the speed of reads into huge pages). A medium buffer that
// finds no slot, where the budget has no room for a new slab twice over, gets a mapping of its own,
// as do the other sizes above kSlabMax (from 2 MiB on, huge pages already).
//
// Thread-safety: every member may be called from any thread (one internal mutex). SwapBuffers hold
// a shared_ptr to the pool, so they may outlive the swapper; destroying one returns its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "nvio/memory.hpp"
#include "nvio/swapper.hpp"

namespace nvio::detail {

class SwapPool : public std::enable_shared_from_this<SwapPool> {
 public:
  static constexpr std::size_t kSlabSize = 64 * 1024;
  static constexpr std::size_t kSlabMax = 2048;

  // `keep_free`: the most free memory kept for reuse; beyond it, memory a buffer returns is
  // unmapped at once (the swapper keeps all it may, under its budget; a pool without a budget,
  // such as the binding's for locked tensors, must not keep its peak for ever).
  SwapPool(std::uint64_t budget, LockMode lock,
           std::uint64_t keep_free = std::numeric_limits<std::uint64_t>::max())
      : budget_(budget), lock_(lock), keep_free_(keep_free) {}

  // Whether a buffer of `size` bytes is a slot of a huge-page slab (256 KiB up to 2 MiB):
  // page-aligned and, where the kernel gives huge pages, physically contiguous.
  static bool is_medium(std::size_t size) noexcept;
  // Registers the pool's mutex with nvio/fork.hpp, for a pool that lives as long as the process
  // and that a forked child may use.
  void hold_across_fork() noexcept;

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
    AlignedBuffer memory;  // kSlabSize, or whole huge pages for medium slots
    std::size_t slot_size = 0;
    std::vector<std::uint32_t> free_slots;
    std::uint32_t used = 0;
  };

  bool fits(std::uint64_t bytes) const noexcept { return charged_ + mapped_ + bytes <= budget_; }
  // A slot of `slot` bytes lent as a buffer of `size`, from a slab of its class or a new slab of
  // `slab_bytes`, made only where the budget has `room` (>= slab_bytes) bytes free and, given
  // `idle_cap`, the unused slots of slabs in use stay within it with the new slab's. Called and
  // returns null with `lock` held (no slab has a free slot and a new one may not be made);
  // returns the buffer with `lock` released.
  std::shared_ptr<SwapBuffer> take_slot(std::unique_lock<std::mutex>& lock, std::size_t size,
                                        std::size_t slot, std::size_t slab_bytes,
                                        std::uint64_t room, std::optional<std::uint64_t> idle_cap);
  // Bytes of slabs with a slot in use that no slot uses (mutex held).
  std::uint64_t idle_in_used_slabs() const noexcept;
  // Whether `bytes` more fit the budget, after dropping as much free memory as that needs
  // (nothing is dropped when they cannot fit even so). Called with the mutex held.
  bool make_room(std::uint64_t bytes) noexcept;
  // Drops free memory (the largest buffers first, then empty slabs) until done() (mutex held).
  template <class Done>
  void drop_free(const Done& done) noexcept;
  void release(Slab* slab, void* p, AlignedBuffer large) noexcept;
  static std::uint64_t mapping_size(std::size_t size) noexcept;

  const std::uint64_t budget_;
  const LockMode lock_;
  const std::uint64_t keep_free_;
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
