// Process-wide mutexes across fork(). Internal to the library.
//
// fork() copies only the calling thread. A mutex that another thread held at that moment stays
// locked in the child for ever, and the child's first use of it hangs (a DataLoader worker
// allocating a bounce buffer, say). Every process-wide mutex of the library that a forked child
// may take is therefore held by the forking thread for the duration of fork(): the prepare
// handler locks it, and the parent and child handlers unlock it.
//
// Order: POSIX runs prepare handlers in the reverse order of registration, so a mutex that is
// taken while another is held (an outer one) must be registered after it. The mutexes registered
// here are leaves or are registered in that order (see each caller).
//
// Thread-safety: registration is done once per mutex, from the function-local static that first
// makes it; `Get` must return the same mutex every time and never throw.
#pragma once

#include <pthread.h>

#include <mutex>

namespace nvio::detail {

template <std::mutex& (*Get)()>
void hold_across_fork() noexcept {
  // Fails only with ENOMEM; the mutex is then taken as a child finds it, as without this.
  (void)::pthread_atfork([] { Get().lock(); }, [] { Get().unlock(); }, [] { Get().unlock(); });
}

}  // namespace nvio::detail
