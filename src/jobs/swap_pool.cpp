#include "jobs/swap_pool.hpp"

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>

#include "core/align.hpp"
#include "core/fork.hpp"

namespace nvio::detail {

namespace {

constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;
constexpr std::uint64_t kPage = 4096;
constexpr std::size_t kMinSlot = 16;

std::size_t slot_size(std::size_t size) { return std::bit_ceil(std::max(size, kMinSlot)); }

// Medium buffers (256 KiB to below a huge page): the slot is the size rounded up to a multiple of
// an eighth of its power of two, so at most 1/8 of a slot is unused. Smaller buffers gain nothing
// from huge pages (64 pages are far below any drive's segment limit) and would leave most of a
// 2 MiB slab unused.
constexpr std::size_t kMediumMin = 256 * 1024;

std::size_t medium_slot(std::size_t size) {
  const std::size_t step = std::bit_floor(size) / 8;
  return static_cast<std::size_t>(round_up(size, step));
}

// The slab for medium slots of `slot` bytes: the fewest huge pages (at most 8) that leave no more
// than an eighth of the slab unused, so 1 MiB slots take one huge page each two and 1.125 MiB
// slots five to three.
std::size_t medium_slab(std::size_t slot) {
  std::size_t bytes = kHugePage;
  for (unsigned pages = 1; pages <= 8; ++pages) {
    bytes = pages * kHugePage;
    if (bytes % slot <= bytes / 8) break;
  }
  return bytes;
}

}  // namespace

bool SwapPool::is_medium(std::size_t size) noexcept {
  return size >= kMediumMin && size < kHugePage;
}

// A lent buffer: a slab slot, or a large buffer of its own. Returns its memory on destruction.
class SwapPool::Lent final : public SwapBuffer {
 public:
  Lent(std::shared_ptr<SwapPool> pool, Slab* slab, void* data, std::size_t size,
       AlignedBuffer large)
      : pool_(std::move(pool)), slab_(slab), data_(data), size_(size), large_(std::move(large)) {}
  ~Lent() override { pool_->release(slab_, data_, std::move(large_)); }
  void* data() const noexcept override { return data_; }
  std::size_t size() const noexcept override { return size_; }

 private:
  std::shared_ptr<SwapPool> pool_;
  Slab* slab_;
  void* data_;
  std::size_t size_;
  AlignedBuffer large_;
};

// AlignedBuffer's own rounding (memory/aligned_buffer.cpp): what a buffer of `size` bytes maps.
std::uint64_t SwapPool::mapping_size(std::size_t size) noexcept {
  return size >= kHugePage ? round_up_saturating(size, kHugePage) : round_up(size, kPage);
}

std::uint64_t SwapPool::footprint(std::size_t size) noexcept {
  // A medium buffer that finds no room for a slab takes a mapping of its own: that is the least.
  return size <= kSlabMax ? kSlabSize : mapping_size(size);
}

std::uint64_t SwapPool::idle_in_used_slabs() const noexcept {
  std::uint64_t idle = 0;
  for (const auto& [slot, list] : slabs_) {
    for (const auto& s : list) {
      if (s->used != 0) idle += s->memory.size() - std::uint64_t{s->used} * slot;
    }
  }
  return idle;
}

std::shared_ptr<SwapBuffer> SwapPool::take_slot(std::unique_lock<std::mutex>& lock,
                                                std::size_t size, std::size_t slot,
                                                std::size_t slab_bytes, std::uint64_t room,
                                                std::optional<std::uint64_t> idle_cap) {
  auto& list = slabs_[slot];
  Slab* slab = nullptr;
  for (auto& s : list) {
    if (!s->free_slots.empty()) {
      slab = s.get();
      break;
    }
  }
  if (slab == nullptr) {
    // Counted only here, where a new slab is wanted: walking every slab on each allocation
    // would tax the common case, a free slot.
    if (idle_cap && idle_in_used_slabs() + slab_bytes - slot > *idle_cap) return nullptr;
    if (!make_room(room)) return nullptr;
    // Counted before mapping, which happens outside the lock (locking up to 16 MiB of huge pages
    // takes milliseconds), so that nobody else takes the room meanwhile.
    mapped_ += slab_bytes;
    auto fresh = std::make_unique<Slab>();
    lock.unlock();
    try {
      fresh->memory = AlignedBuffer(slab_bytes, lock_);
    } catch (...) {
      lock.lock();
      mapped_ -= slab_bytes;
      throw;
    }
    lock.lock();
    fresh->slot_size = slot;
    const auto count = static_cast<std::uint32_t>(slab_bytes / slot);
    fresh->free_slots.reserve(count);
    for (std::uint32_t i = count; i > 0; --i) fresh->free_slots.push_back(i - 1);
    slab = fresh.get();
    list.push_back(std::move(fresh));
  } else if (slab->used == 0) {
    free_ -= slab->memory.size();  // an empty slab kept for reuse is in use again
  }
  const std::uint32_t index = slab->free_slots.back();
  slab->free_slots.pop_back();
  ++slab->used;
  std::byte* p = slab->memory.bytes() + std::size_t{index} * slot;
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  lent_[start] = start + size;
  lock.unlock();
  return std::make_shared<Lent>(shared_from_this(), slab, p, size, AlignedBuffer());
}

std::shared_ptr<SwapBuffer> SwapPool::try_allocate(std::size_t size) {
  std::unique_lock lock(mutex_);
  if (size <= kSlabMax) {
    return take_slot(lock, size, slot_size(size), kSlabSize, kSlabSize, std::nullopt);
  }
  if (is_medium(size)) {
    const std::size_t slot = medium_slot(size);
    const std::size_t slab = medium_slab(slot);
    // A new slab only where the budget has room for it twice over, and where the slots nobody
    // uses in slabs somebody does (which no drop can return) stay within an eighth of the
    // budget with the new slab's: slabs of several size classes, each with a slot or two lent
    // for long, must not take the room the buffers themselves need (a 300 KiB buffer held
    // pins its whole 2 MiB slab). Budgets of a few MiB therefore get no slabs. Those slots are
    // memory kept unused, so keep_free bounds them too (a pool without a budget, the binding's
    // for locked tensors, would otherwise pin a slab per size class for a buffer or two).
    if (auto b = take_slot(lock, size, slot, slab, 2 * std::uint64_t{slab},
                           std::min(budget_ / 8, keep_free_))) {
      return b;
    }
    // No room for a slab (take_slot keeps the lock then): a mapping of its own, if that fits.
  }
  const std::uint64_t mapping = mapping_size(size);
  AlignedBuffer buffer;
  if (auto it = free_large_.find(mapping); it != free_large_.end()) {
    buffer = std::move(it->second);
    free_large_.erase(it);
    free_ -= mapping;
  } else {
    if (!make_room(mapping)) return nullptr;
    mapped_ += mapping;  // counted before mapping, outside the lock, so nobody else takes it
    lock.unlock();
    try {
      buffer = AlignedBuffer(mapping, lock_);
    } catch (...) {
      lock.lock();
      mapped_ -= mapping;
      throw;
    }
    lock.lock();
  }
  void* p = buffer.data();
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  lent_[start] = start + size;
  lock.unlock();
  return std::make_shared<Lent>(shared_from_this(), nullptr, p, size, std::move(buffer));
}

void SwapPool::release(Slab* slab, void* p, AlignedBuffer large) noexcept {
  std::lock_guard lock(mutex_);
  lent_.erase(reinterpret_cast<std::uintptr_t>(p));
  if (slab != nullptr) {
    const auto index = static_cast<std::uint32_t>(
        (static_cast<std::byte*>(p) - slab->memory.bytes()) / static_cast<long>(slab->slot_size));
    slab->free_slots.push_back(index);
    if (--slab->used == 0) free_ += slab->memory.size();
  } else {
    const std::uint64_t mapping = mapping_size(large.size());
    free_ += mapping;
    free_large_.emplace(mapping, std::move(large));
  }
  if (free_ > keep_free_) drop_free([&] { return free_ <= keep_free_; });
}

template <class Done>
void SwapPool::drop_free(const Done& done) noexcept {
  while (!done() && !free_large_.empty()) {
    auto last = std::prev(free_large_.end());
    mapped_ -= last->first;
    free_ -= last->first;
    free_large_.erase(last);  // unmaps it
  }
  for (auto& [slot, list] : slabs_) {
    if (done()) break;
    // The predicate runs once per slab, in order, and stops dropping once done.
    std::erase_if(list, [&](const std::unique_ptr<Slab>& s) {
      if (s->used != 0 || done()) return false;
      mapped_ -= s->memory.size();
      free_ -= s->memory.size();
      return true;
    });
  }
}

bool SwapPool::make_room(std::uint64_t bytes) noexcept {
  if (fits(bytes)) return true;
  if (charged_ + mapped_ - free_ + bytes > budget_) return false;  // not even with none kept
  // Drops free memory, the largest first, only until `bytes` fit: dropping it all (as this did)
  // made a pool kept warm for the next reads map and lock everything again after each burst of
  // write-behind, which on this VM costs about 1 s per 512 MiB.
  drop_free([&] { return fits(bytes); });
  return fits(bytes);
}

void SwapPool::hold_across_fork() noexcept { detail::hold_across_fork(mutex_); }

bool SwapPool::try_charge(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (!make_room(bytes)) return false;
  charged_ += bytes;
  return true;
}

void SwapPool::uncharge(std::uint64_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  charged_ -= bytes;
}

bool SwapPool::owns(const void* p, std::size_t size) const noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mutex_);
  auto it = lent_.upper_bound(start);
  if (it == lent_.begin()) return false;
  --it;
  return start >= it->first && start + size <= it->second;
}

std::uint64_t SwapPool::held() const noexcept {
  std::lock_guard lock(mutex_);
  return charged_ + mapped_;
}

std::uint64_t SwapPool::charged() const noexcept {
  std::lock_guard lock(mutex_);
  return charged_;
}

std::uint64_t SwapPool::mapped() const noexcept {
  std::lock_guard lock(mutex_);
  return mapped_;
}

std::uint64_t SwapPool::free_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return free_;
}

}  // namespace nvio::detail
