// Rounding to a multiple (alignment arithmetic), in one place. Internal to the library.
#pragma once

#include <cstdint>

namespace nvio::detail {

// The smallest multiple of `a` (> 0) that is at least `n`.
constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t a) noexcept {
  return (n + a - 1) / a * a;
}

// round_up, or the largest std::uint64_t where the multiple is past it: never wraps to a small
// number (2^64 - 1 rounded to pages would be 0). For sizes read from files, so that an absurd one
// stays absurd and is refused as too large rather than taken as a tiny one.
constexpr std::uint64_t round_up_saturating(std::uint64_t n, std::uint64_t a) noexcept {
  const std::uint64_t most = ~std::uint64_t{0};
  return n > most - (a - 1) ? most : round_up(n, a);
}

// The largest multiple of `a` (> 0) that is at most `n`.
constexpr std::uint64_t round_down(std::uint64_t n, std::uint64_t a) noexcept { return n / a * a; }

}  // namespace nvio::detail
