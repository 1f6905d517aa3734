// Process-wide mutexes across fork(). Internal to the library.
//
// fork() copies only the calling thread. A mutex that another thread held at that moment stays
// locked in the child for ever, and the child's first use of it hangs (a DataLoader worker
// allocating a bounce buffer, say). Every process-wide mutex of the library that a forked child
// may take is therefore registered here and held by the forking thread for the duration of fork():
// one prepare handler locks them all, and the parent and child handlers unlock them.
//
// Order: the prepare handler locks by rank (every Leaf, then the warning state, then the Python
// binding's warning queue, which the warning sink takes under the state's mutex), so the order
// in which mutexes happen to be registered does not matter.
//
// Registration never blocks and never allocates, so that it may run inside the initializer of a
// function-local static while another thread forks (pthread_atfork, which registration used to
// call, waits for a fork in progress on glibc before 2.36). The one pthread_atfork call is made
// when the library is loaded. The statics that worker threads reach are made at load time or
// constant-initialised (a thread inside a static's initialisation when another thread forks leaves
// the child that static's guard taken for ever).
//
// Thread-safety: hold_across_fork may be called from any thread; the mutex must outlive the
// process (the callers' mutexes are globals or leaked).
#pragma once

#include <cstddef>
#include <mutex>

namespace nvio::detail {

enum class ForkRank : unsigned char {
  Leaf,          // nothing registered is taken while it is held
  WarningState,  // core/warnings.cpp: held while the sink runs
  WarningSink,   // the Python binding's queue, taken by its sink
};

// Registers `mutex` (at most kMaxForkMutexes in a process; each call site registers once).
void hold_across_fork(std::mutex& mutex, ForkRank rank = ForkRank::Leaf) noexcept;

inline constexpr std::size_t kMaxForkMutexes = 64;

// How many registrations were made, including any beyond the cap (for tests).
std::size_t fork_mutex_count() noexcept;

}  // namespace nvio::detail
