#include "core/interrupt.hpp"

namespace nvio {
namespace {

thread_local InterruptCheck* t_check = nullptr;

}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(InterruptCheck& check) noexcept : previous_(t_check) {
  t_check = &check;
}

ScopedInterruptCheck::ScopedInterruptCheck(std::nullptr_t) noexcept : previous_(t_check) {
  t_check = nullptr;
}

ScopedInterruptCheck::~ScopedInterruptCheck() { t_check = previous_; }

namespace detail {

InterruptCheck* interrupt_check() noexcept { return t_check; }

}  // namespace detail
}  // namespace nvio
