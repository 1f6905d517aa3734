// Rounding to a multiple (alignment arithmetic), in one place. Internal to the library.
#pragma once

#include <cstdint>

namespace nvio::detail {

// The smallest multiple of `a` (> 0) that is at least `n`.
constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t a) noexcept {
  return (n + a - 1) / a * a;
}

// The largest multiple of `a` (> 0) that is at most `n`.
constexpr std::uint64_t round_down(std::uint64_t n, std::uint64_t a) noexcept { return n / a * a; }

}  // namespace nvio::detail
