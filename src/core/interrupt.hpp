// Waits that a thread's InterruptCheck (nvio/interrupt.hpp) can stop. Internal to the library.
//
// The check is asked every kInterruptPeriod of a call's time, not after every 20 ms of one sleep:
// a call made of many short waits (a batch of small extents, each finished within milliseconds)
// would otherwise never ask it. The time of the next question is the thread's own, set when a
// scope installs a check and after each question.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "nvio/interrupt.hpp"

namespace nvio::detail {

// Whether a wait may be stopped by the thread's check. A wait that must see the end of what the
// kernel holds (a cancelled call draining its pieces, a destructor) is Uninterruptible.
enum class WaitMode { Interruptible, Uninterruptible };

// The calling thread's check (ScopedInterruptCheck), or null.
InterruptCheck* interrupt_check() noexcept;
// When the thread's check is to be asked next.
std::chrono::steady_clock::time_point next_interrupt_question() noexcept;
// Asks `check` now and schedules the next question; true: stop.
bool ask_interrupt(InterruptCheck& check) noexcept;
// For a wait about to start: with an Interruptible `mode` and a check installed whose time has
// come, asks it; true: stop before waiting. Costs a clock read with a check installed, nothing
// without.
bool interrupt_overdue(WaitMode mode) noexcept;

// Sleeps on `cv` with `lock` held until `ready()`. An Interruptible wait on a thread with a check
// sleeps until the check's next question at most, asks it (with `lock` let go, so that the check
// never runs under the caller's mutex) and goes on; it returns false when the check said to stop
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
    if (cv.wait_until(lock, next_interrupt_question(), ready)) return true;
    lock.unlock();
    const bool stop = ask_interrupt(*check);
    lock.lock();
    if (stop) return false;
  }
  return true;
}

}  // namespace nvio::detail
