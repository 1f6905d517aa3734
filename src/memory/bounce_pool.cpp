#include "memory/bounce_pool.hpp"

#include <algorithm>

namespace nvio::detail {

BouncePool::BouncePool(std::size_t chunk_size, std::size_t max_count)
    : chunk_size_((chunk_size + 4095) / 4096 * 4096), max_count_(max_count) {
  // Every chunk can be free at once: with room for all of them, release() never allocates (it is
  // noexcept, and a worker releases chunks while it recovers from running out of memory).
  free_.reserve(max_count_);
}

std::byte* BouncePool::acquire() {
  if (free_.empty()) {
    // Slabs of 1, 1, 2, 4, ... chunks: few allocations, and at most twice what is in use.
    const std::size_t grow =
        std::min(std::max<std::size_t>(allocated_, 1), max_count_ - allocated_);
    AlignedBuffer& slab = slabs_.emplace_back(chunk_size_ * grow, LockMode::Try);
    for (std::size_t i = grow; i > 0; --i) free_.push_back(slab.bytes() + (i - 1) * chunk_size_);
    allocated_ += grow;
    if (hook_) hook_(slab.bytes(), slab.size());
  }
  std::byte* chunk = free_.back();
  free_.pop_back();
  return chunk;
}

std::size_t BouncePool::slab_of(const std::byte* chunk) const noexcept {
  // A few slabs at most (they double in size): a scan is as quick as anything.
  std::size_t k = 0;
  while (k + 1 < slabs_.size() &&
         !(chunk >= slabs_[k].bytes() && chunk < slabs_[k].bytes() + slabs_[k].size())) {
    ++k;
  }
  return k;
}

void BouncePool::on_slab(SlabHook hook) {
  hook_ = std::move(hook);
  if (!hook_) return;
  for (AlignedBuffer& slab : slabs_) hook_(slab.bytes(), slab.size());
}

}  // namespace nvio::detail
