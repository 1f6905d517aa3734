// A data pattern that locates errors: the 8-byte little-endian word at every file offset that is
// a multiple of 8 holds that offset mixed with a seed, so a wrong byte tells where it came from (a
// shifted copy shows up as the wrong offset; stale data from another run as the wrong seed).
// Used by `nvio bench --verify`, the test suites and the Python tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio::pattern {

// The word stored at file offset `word_offset` (a multiple of 8).
std::uint64_t word_at(std::uint64_t word_offset, std::uint64_t seed) noexcept;

// Fills buf[0, len) with the bytes that belong at file offsets [file_offset, file_offset + len).
void fill(void* buf, std::size_t len, std::uint64_t file_offset, std::uint64_t seed) noexcept;

// Returns the file offset of the first byte in buf[0, len) that differs from the pattern, or
// nullopt when all match.
std::optional<std::uint64_t> first_mismatch(const void* buf, std::size_t len,
                                            std::uint64_t file_offset, std::uint64_t seed) noexcept;

}  // namespace nvio::pattern
NVIO_API_END
