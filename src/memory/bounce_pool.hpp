// A fixed set of aligned bounce chunks, allocated on first use and reused for the life of its
// owner, so that steady-state I/O through bounce buffers allocates nothing.
//
// Ownership and thread-safety: each handle worker owns one pool and is its only user.
#pragma once

#include <cstddef>
#include <vector>

#include "nvio/memory.hpp"

namespace nvio::detail {

class BouncePool {
 public:
  // `chunk_size` is rounded up to a page; `count` chunks are made available.
  BouncePool(std::size_t chunk_size, std::size_t count);

  std::size_t chunk_size() const noexcept { return chunk_size_; }
  bool available() const noexcept { return !allocated_ || !free_.empty(); }
  // Returns a page-aligned chunk, allocating the whole pool on first call. Precondition:
  // available(). Throws MemoryError if the first allocation fails.
  std::byte* acquire();
  void release(std::byte* chunk) noexcept { free_.push_back(chunk); }

 private:
  std::size_t chunk_size_;
  std::size_t count_;
  bool allocated_ = false;
  AlignedBuffer slab_;
  std::vector<std::byte*> free_;
};

}  // namespace nvio::detail
