// Mutexes held across fork(), for a program whose own mutexes the library's threads may take.
//
// fork() copies only the calling thread. A mutex that another thread held at that moment stays
// locked in the child for ever, and the child's first use of it hangs (a DataLoader worker
// allocating a buffer, say). The library registers each of its process-wide mutexes that a forked
// child may take here, and holds them all in the forking thread for the duration of fork() (one
// pthread_atfork prepare handler locks them, the parent and child handlers unlock them). A program
// registers a mutex of its own that the library's threads take: the queue of a warning sink
// (nvio/warnings.hpp), which runs on whatever thread warns.
//
// Order: mutexes are locked by rank, so the order in which they were registered does not matter.
//
// Ownership: the library keeps a pointer to a registered mutex for the rest of the process and
// never unregisters it, so the mutex must outlive the process (a global, or one that is leaked).
// At most 64 mutexes are held in a process (the library registers a few); one registered beyond
// that is taken as a child finds it, as without this.
//
// Thread-safety: hold_across_fork may be called from any thread, also inside the initialiser of
// a function-local static while another thread forks: it never blocks and never allocates.
#pragma once

#include <mutex>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

enum class ForkRank : unsigned char {
  Leaf,          // no registered mutex is taken while it is held
  WarningState,  // the library's warning state, held while the warning sink runs
  WarningSink,   // a mutex the warning sink takes (under the library's WarningState)
};

// Registers `mutex` to be held across every later fork() of the process (see above). Each mutex
// is registered once.
void hold_across_fork(std::mutex& mutex, ForkRank rank = ForkRank::Leaf) noexcept;

}  // namespace nvio
NVIO_API_END
