// Aligned bounce chunks, allocated as the worker's concurrency needs them (never more than
// `max_count`) and reused for the life of the owner, so that steady-state I/O through bounce
// buffers allocates nothing and memory follows what is really in flight: a worker that only ever
// bounces one piece at a time holds one chunk, not the whole cap.
//
// Ownership and thread-safety: each handle worker owns one pool and is its only user.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "nvio/memory.hpp"

namespace nvio::detail {

class BouncePool {
 public:
  // `chunk_size` is rounded up to a page; at most `max_count` chunks are ever allocated.
  BouncePool(std::size_t chunk_size, std::size_t max_count);

  std::size_t chunk_size() const noexcept { return chunk_size_; }
  std::size_t max_count() const noexcept { return max_count_; }
  bool available() const noexcept { return !free_.empty() || allocated_ < max_count_; }
  // Returns a page-aligned chunk, growing the pool by a slab (doubling, up to the cap) when none
  // is free. Precondition: available(). Throws MemoryError if a slab cannot be allocated.
  std::byte* acquire();
  void release(std::byte* chunk) noexcept { free_.push_back(chunk); }
  // Calls `hook(slab, bytes)` for every slab allocated so far and for each one allocated later
  // (the device path registers slabs with CUDA this way, once, when device memory first shows
  // up). The hook must not throw.
  using SlabHook = std::function<void(std::byte* slab, std::size_t bytes)>;
  void on_slab(SlabHook hook);
  // The slabs allocated so far, in order (a slab stays where it is for the pool's life), and the
  // one that holds `chunk` (a pointer acquire() returned).
  std::size_t slab_count() const noexcept { return slabs_.size(); }
  std::span<std::byte> slab(std::size_t index) noexcept {
    return {slabs_[index].bytes(), slabs_[index].size()};
  }
  std::size_t slab_of(const std::byte* chunk) const noexcept;

 private:
  std::size_t chunk_size_;
  std::size_t max_count_;
  std::size_t allocated_ = 0;  // chunks in all slabs
  std::vector<AlignedBuffer> slabs_;
  std::vector<std::byte*> free_;
  SlabHook hook_;
};

}  // namespace nvio::detail
