#include "core/interrupt.hpp"

namespace nvio {
namespace {

using Clock = std::chrono::steady_clock;

thread_local InterruptCheck* t_check = nullptr;
thread_local Clock::time_point t_next_question;

}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(InterruptCheck& check) noexcept : previous_(t_check) {
  t_check = &check;
  t_next_question = Clock::now() + kInterruptPeriod;
}

ScopedInterruptCheck::ScopedInterruptCheck(std::nullptr_t) noexcept : previous_(t_check) {
  t_check = nullptr;
}

ScopedInterruptCheck::~ScopedInterruptCheck() { t_check = previous_; }

namespace detail {

InterruptCheck* interrupt_check() noexcept { return t_check; }

Clock::time_point next_interrupt_question() noexcept { return t_next_question; }

bool ask_interrupt(InterruptCheck& check) noexcept {
  const bool stop = check.interrupted();
  t_next_question = Clock::now() + kInterruptPeriod;
  return stop;
}

bool interrupt_overdue(WaitMode mode) noexcept {
  if (mode != WaitMode::Interruptible || t_check == nullptr) return false;
  if (Clock::now() < t_next_question) return false;
  return ask_interrupt(*t_check);
}

}  // namespace detail
}  // namespace nvio
