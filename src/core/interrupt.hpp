// Waits that a thread's InterruptCheck (nvio/interrupt.hpp) can stop. Internal to the library.
#pragma once

#include <condition_variable>
#include <mutex>

#include "nvio/interrupt.hpp"

namespace nvio::detail {

// Whether a wait may be stopped by the thread's check. A wait that must see the end of what the
// kernel holds (a cancelled call draining its pieces, a destructor) is Uninterruptible.
enum class WaitMode { Interruptible, Uninterruptible };

// The calling thread's check (ScopedInterruptCheck), or null.
InterruptCheck* interrupt_check() noexcept;

// Sleeps on `cv` with `lock` held until `ready()`. An Interruptible wait on a thread with a check
// sleeps kInterruptPeriod at a time and asks the check in between (with `lock` let go, so that
// the check never runs under the caller's mutex); it returns false when the check said to stop
// (ready() may be false then), true once ready() holds.
template <class Ready>
bool wait_ready(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready,
                WaitMode mode) {
  InterruptCheck* check = mode == WaitMode::Interruptible ? interrupt_check() : nullptr;
  if (check == nullptr) {
    cv.wait(lock, ready);
    return true;
  }
  while (!ready()) {
    if (cv.wait_for(lock, kInterruptPeriod, ready)) return true;
    lock.unlock();
    const bool stop = check->interrupted();
    lock.lock();
    if (stop) return false;
  }
  return true;
}

}  // namespace nvio::detail
