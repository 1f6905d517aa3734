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
#include <cstdint>

namespace nvio::detail {

// How long an idle worker polls for the next submission: the caller that waited for the last
// completion submits again within microseconds. Longer took a CPU from the caller and the
// kernel with several workers (4 workers, 8 operations each in flight: 0.83x with 150 us).
inline constexpr std::chrono::microseconds kWorkSpinLimit{50};

// How long a caller waiting for `bytes` of I/O polls before it sleeps. A small transfer (a 4 KiB
// read from this VM's disk takes about 60 us) gets 150 us, so that the caller finds it done
// instead of asleep: at queue depth 1, 4 KiB ran at 0.62-0.77x fio's IOPS with 50 us and at
// 0.99-1.08x with 150 us. A large one will not finish within that, and polling only costs: in a
// VM the polling vCPU takes host CPU from the emulated drive (one 1 MiB read at a time ran 15%
// slower with 150 us), so it keeps 50 us. See bench/results.md, "Polling for 150 us".
inline constexpr std::uint64_t kSmallTransfer = 64 * 1024;
inline constexpr std::chrono::microseconds completion_spin_limit(std::uint64_t bytes) noexcept {
  return bytes <= kSmallTransfer ? std::chrono::microseconds{150} : kWorkSpinLimit;
}

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
