#include "memory/bounce_pool.hpp"

namespace nvio::detail {

BouncePool::BouncePool(std::size_t chunk_size, std::size_t count)
    : chunk_size_((chunk_size + 4095) / 4096 * 4096), count_(count) {}

std::byte* BouncePool::acquire() {
  if (!allocated_) {
    slab_ = AlignedBuffer(chunk_size_ * count_, LockMode::Try);
    free_.reserve(count_);
    for (std::size_t i = count_; i > 0; --i) free_.push_back(slab_.bytes() + (i - 1) * chunk_size_);
    allocated_ = true;
  }
  std::byte* chunk = free_.back();
  free_.pop_back();
  return chunk;
}

}  // namespace nvio::detail
