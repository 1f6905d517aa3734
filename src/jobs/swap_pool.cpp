#include "jobs/swap_pool.hpp"

#include <algorithm>
#include <bit>
#include <utility>

#include "core/align.hpp"

namespace nvio::detail {

namespace {

constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;
constexpr std::uint64_t kPage = 4096;
constexpr std::size_t kMinSlot = 16;

std::size_t slot_size(std::size_t size) { return std::bit_ceil(std::max(size, kMinSlot)); }

}  // namespace

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
  return size >= kHugePage ? round_up(size, kHugePage) : round_up(size, kPage);
}

std::uint64_t SwapPool::footprint(std::size_t size) noexcept {
  return size <= kSlabMax ? kSlabSize : mapping_size(size);
}

std::shared_ptr<SwapBuffer> SwapPool::try_allocate(std::size_t size) {
  std::unique_lock lock(mutex_);
  if (size <= kSlabMax) {
    const std::size_t slot = slot_size(size);
    auto& list = slabs_[slot];
    Slab* slab = nullptr;
    for (auto& s : list) {
      if (!s->free_slots.empty()) {
        slab = s.get();
        break;
      }
    }
    if (slab == nullptr) {
      if (!fits(kSlabSize)) drop_free_locked();
      if (!fits(kSlabSize)) return nullptr;
      auto fresh = std::make_unique<Slab>();
      fresh->memory = AlignedBuffer(kSlabSize, lock_);
      fresh->slot_size = slot;
      const auto count = static_cast<std::uint32_t>(kSlabSize / slot);
      fresh->free_slots.reserve(count);
      for (std::uint32_t i = count; i > 0; --i) fresh->free_slots.push_back(i - 1);
      slab = fresh.get();
      list.push_back(std::move(fresh));
      mapped_ += kSlabSize;
    } else if (slab->used == 0) {
      free_ -= kSlabSize;  // an empty slab kept for reuse is in use again
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
  const std::uint64_t mapping = mapping_size(size);
  AlignedBuffer buffer;
  if (auto it = free_large_.find(mapping); it != free_large_.end()) {
    buffer = std::move(it->second);
    free_large_.erase(it);
    free_ -= mapping;
  } else {
    if (!fits(mapping)) drop_free_locked();
    if (!fits(mapping)) return nullptr;
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
    if (--slab->used == 0) free_ += kSlabSize;
    return;
  }
  const std::uint64_t mapping = mapping_size(large.size());
  free_ += mapping;
  free_large_.emplace(mapping, std::move(large));
}

void SwapPool::drop_free_locked() noexcept {
  free_large_.clear();  // unmaps them
  for (auto& [slot, list] : slabs_) {
    std::erase_if(list, [](const std::unique_ptr<Slab>& s) { return s->used == 0; });
  }
  mapped_ -= free_;
  free_ = 0;
}

bool SwapPool::try_charge(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (!fits(bytes)) drop_free_locked();
  if (!fits(bytes)) return false;
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
