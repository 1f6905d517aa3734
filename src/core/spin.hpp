// Brief busy-waiting before sleeping on a condition variable. Internal to the library.
//
// Handing a small operation from one thread to another through a condition variable costs a
// futex wake and a context switch on each side: tens of microseconds in a virtual machine, more
// than a 4 KiB read from a fast drive takes. So a thread about to sleep for something that
// usually comes within microseconds (the next submission, the completion of a small operation)
// first polls for it for a short while. Never on a single CPU, where polling would only keep the
// thread it waits for from running.
#pragma once

#include <sched.h>

#include <chrono>

namespace nvio::detail {

// How long a caller waiting for its operation polls before it sleeps: longer than a 4 KiB read
// from a drive takes, so that it finds the read done instead of asleep. 50 us was shorter than
// this VM's disk (about 60 us a read): 4 KiB at queue depth 1 ran at 0.62-0.77x fio's IOPS, and
// at 0.99-1.08x with 150 us (docs/performance.md, "Polling for 150 us").
inline constexpr std::chrono::microseconds kCompletionSpinLimit{150};
// How long an idle worker polls for the next submission: the caller that waited for the last
// completion submits again within microseconds. Longer took a CPU from the caller and the
// kernel with several workers (4 workers, 8 operations each in flight: 0.83x with 150 us).
inline constexpr std::chrono::microseconds kWorkSpinLimit{50};

// Whether this process may run on more than one CPU (asked once).
inline bool spinning_pays() noexcept {
  static const bool pays = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    return ::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1;
  }();
  return pays;
}

// Polls `ready` (a cheap check of an atomic) until it returns true or `limit` has passed.
// Returns its last answer. Thread-safe as `ready` is.
template <class Ready>
bool spin_until(std::chrono::microseconds limit, Ready ready) noexcept(noexcept(ready())) {
  if (ready()) return true;
  if (!spinning_pays()) return false;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (unsigned i = 1;; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
    if (ready()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace nvio::detail
