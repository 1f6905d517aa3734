// Process-wide mutexes across fork(): the registry behind nvio/fork.hpp, whose comment says what
// it does and why. Internal to the library: the cap and the count, for tests.
//
// The library's own registrations: every process-wide mutex that a forked child may take. The
// statics that worker threads reach are made at load time or constant-initialised (a thread inside
// a static's initialisation when another thread forks leaves the child that static's guard taken
// for ever). The one pthread_atfork call is made when the library is loaded (pthread_atfork, which
// registration used to call, waits for a fork in progress on glibc before 2.36).
#pragma once

#include <cstddef>

#include "nvio/fork.hpp"

namespace nvio::detail {

using nvio::ForkRank;
using nvio::hold_across_fork;

inline constexpr std::size_t kMaxForkMutexes = 64;

// How many registrations were made, including any beyond the cap (for tests).
std::size_t fork_mutex_count() noexcept;

}  // namespace nvio::detail
