// Locked host memory for many separate buffers (nvio/locked_memory.hpp): the process's SwapPool
// for the sizes that are slots of huge-page slabs, an AlignedBuffer of its own for the others.
#include "nvio/locked_memory.hpp"

#include <cerrno>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "jobs/swap_pool.hpp"
#include "nvio/errors.hpp"
#include "nvio/memory.hpp"

namespace nvio {
namespace {

// No budget; at most 32 MiB of free slabs (and of unused slots in slabs in use) kept for reuse.
// Leaked, since buffers may outlive every static; its mutex is held across fork.
detail::SwapPool& process_pool() {
  static auto* pool = [] {
    auto* p = new std::shared_ptr<detail::SwapPool>(std::make_shared<detail::SwapPool>(
        std::numeric_limits<std::uint64_t>::max(), LockMode::Try, std::uint64_t{32} << 20));
    (*p)->hold_across_fork();
    return p;
  }();
  return **pool;
}

class PoolSlot final : public LockedBuffer {
 public:
  explicit PoolSlot(std::shared_ptr<SwapBuffer> slot) : slot_(std::move(slot)) {}
  void* data() const noexcept override { return slot_->data(); }
  std::size_t size() const noexcept override { return slot_->size(); }

 private:
  std::shared_ptr<SwapBuffer> slot_;
};

class OwnMapping final : public LockedBuffer {
 public:
  explicit OwnMapping(std::size_t size) : buffer_(size, LockMode::Try) {}
  void* data() const noexcept override { return buffer_.data(); }
  std::size_t size() const noexcept override { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
};

}  // namespace

std::shared_ptr<LockedBuffer> allocate_locked(std::size_t size) {
  if (!detail::SwapPool::is_medium(size)) return std::make_shared<OwnMapping>(size);
  std::shared_ptr<SwapBuffer> slot = process_pool().try_allocate(size);
  if (!slot) {
    throw MemoryError("locked memory: no room for " + std::to_string(size) + " bytes", ENOMEM);
  }
  return std::make_shared<PoolSlot>(std::move(slot));
}

}  // namespace nvio
