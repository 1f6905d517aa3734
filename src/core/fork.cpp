#include "core/fork.hpp"

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdlib>

namespace nvio::detail {
namespace {

struct Slot {
  std::atomic<std::mutex*> mutex{nullptr};  // published last: a slot counts once it is set
  ForkRank rank = ForkRank::Leaf;
};

// Constant-initialised, so that registration from another file's static initialisers works
// whatever the order in which the files are initialised.
constinit std::array<Slot, kMaxForkMutexes> g_slots{};
constinit std::atomic<std::size_t> g_reserved{0};
constinit std::atomic<bool> g_installed{false};

// Which slots the prepare handler locked, for the parent and child handlers (all three run in the
// forking thread). An entry is written only by the thread holding that slot's mutex (set after
// locking it, cleared before unlocking it), so two threads forking at once do not disturb it.
constinit std::array<bool, kMaxForkMutexes> g_locked{};

constexpr ForkRank kRanks[] = {ForkRank::Leaf, ForkRank::WarningState, ForkRank::WarningSink};

std::size_t slot_count() noexcept {
  const std::size_t n = g_reserved.load(std::memory_order_acquire);
  return n < kMaxForkMutexes ? n : kMaxForkMutexes;
}

void prepare() noexcept {
  const std::size_t n = slot_count();
  for (ForkRank rank : kRanks) {
    for (std::size_t i = 0; i < n; ++i) {
      std::mutex* m = g_slots[i].mutex.load(std::memory_order_acquire);
      if (m != nullptr && g_slots[i].rank == rank) {
        m->lock();
        g_locked[i] = true;
      }
    }
  }
}

void release() noexcept {
  for (std::size_t i = kMaxForkMutexes; i-- > 0;) {
    if (g_locked[i]) {
      g_locked[i] = false;
      g_slots[i].mutex.load(std::memory_order_relaxed)->unlock();
    }
  }
}

void install() noexcept {
  if (g_installed.exchange(true, std::memory_order_acq_rel)) return;
  // Fails only with ENOMEM; the mutexes are then taken as a child finds them, as without this.
  (void)::pthread_atfork(prepare, release, release);
}

// At load time, before any thread of the library exists, so that registration at run time never
// calls pthread_atfork.
[[maybe_unused]] const bool g_installed_at_load = (install(), true);

}  // namespace

std::size_t fork_mutex_count() noexcept { return g_reserved.load(std::memory_order_acquire); }

}  // namespace nvio::detail

namespace nvio {

void hold_across_fork(std::mutex& mutex, ForkRank rank) noexcept {
  detail::install();  // already done at load time, unless called from an earlier static initialiser
  const std::size_t i = detail::g_reserved.fetch_add(1, std::memory_order_acq_rel);
  if (i >= detail::kMaxForkMutexes) return;  // tests check that the library stays below the cap
  detail::g_slots[i].rank = rank;
  detail::g_slots[i].mutex.store(&mutex, std::memory_order_release);
}

}  // namespace nvio
