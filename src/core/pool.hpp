// Recycled memory for the objects every operation makes (its Operation, its Job, the node of its
// ticket), so that a small operation costs no trip through malloc: blocks of one size are kept on
// a free list when released and handed out again. Internal to the library.
//
// Thread-safety: a pool is shared by all threads (an operation is made by its submitter and
// released by whichever thread lets go of it last); one mutex guards its free list, held across
// fork() (nvio/fork.hpp). The lists are never returned to the system: at most kKeep blocks each.
// Under AddressSanitizer the pool passes everything to operator new, so that a use after free is
// still caught.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "nvio/fork.hpp"

namespace nvio::detail {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPoolBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kPoolBlocks = false;
#else
inline constexpr bool kPoolBlocks = true;
#endif
#else
inline constexpr bool kPoolBlocks = true;
#endif

template <std::size_t Size, std::size_t Align>
class BlockPool {
 public:
  static constexpr std::size_t kKeep = 4096;

  static void* take() {
    if constexpr (kPoolBlocks) {
      BlockPool& p = instance();
      std::lock_guard lock(p.mutex_);
      if (!p.free_.empty()) {
        void* block = p.free_.back();
        p.free_.pop_back();
        return block;
      }
    }
    return ::operator new (Size, std::align_val_t{Align});
  }

  static void give(void* block) noexcept {
    if constexpr (kPoolBlocks) {
      BlockPool& p = instance();
      std::lock_guard lock(p.mutex_);
      if (p.free_.capacity() == 0) {
        try {
          p.free_.reserve(kKeep);          // once; give() never grows the list after this
        } catch (const std::bad_alloc&) {  // then nothing is kept
        }
      }
      if (p.free_.size() < p.free_.capacity()) {
        p.free_.push_back(block);
        return;
      }
    }
    ::operator delete (block, std::align_val_t{Align});
  }

 private:
  constexpr BlockPool() = default;

  // Never destroyed (blocks may be released by threads that outlive static destruction), and
  // constant-initialised: a function-local static made at run time (with `new`, which waits for
  // a fork in progress) could be caught half-made by another thread's fork(), and the child would
  // wait for ever on its initialisation guard. Its mutex is registered for fork() before the first
  // thread takes it.
  union Storage {
    constexpr Storage() : pool() {}
    ~Storage() {}
    BlockPool pool;
  };
  static BlockPool& instance() noexcept {
    static constinit Storage storage;
    BlockPool& p = storage.pool;
    if (p.registered_.load(std::memory_order_acquire) != kRegistered) p.register_for_fork();
    return p;
  }
  void register_for_fork() noexcept {
    int expected = kUnregistered;
    if (registered_.compare_exchange_strong(expected, kRegistering, std::memory_order_acq_rel)) {
      hold_across_fork(mutex_);
      registered_.store(kRegistered, std::memory_order_release);
      return;
    }
    while (registered_.load(std::memory_order_acquire) != kRegistered) std::this_thread::yield();
  }

  static constexpr int kUnregistered = 0;
  static constexpr int kRegistering = 1;
  static constexpr int kRegistered = 2;

  std::mutex mutex_;
  std::vector<void*> free_;  // guarded by mutex_
  std::atomic<int> registered_{kUnregistered};
};

// A standard allocator over BlockPool for single objects (arrays go to operator new), for
// std::allocate_shared and node-based containers.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(std::size_t n) {
    if (n == 1) return static_cast<T*>(BlockPool<sizeof(T), alignof(T)>::take());
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{alignof(T)}));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1) {
      BlockPool<sizeof(T), alignof(T)>::give(p);
    } else {
      ::operator delete (p, std::align_val_t{alignof(T)});
    }
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace nvio::detail
