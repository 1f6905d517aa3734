// The CRC-32s of many buffers on threads, for the torch checkpoint writer (nvio/checkpoint.hpp,
// jobs/checkpoint.cpp). Internal to the library.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace nvio::detail {

// The CRC-32 of each buffer (data, size), computed in pieces on up to as many threads as the
// machine has cores where together they are large (one thread otherwise).
std::vector<std::uint32_t> parallel_crc32(
    std::span<const std::pair<const void*, std::uint64_t>> buffers);

}  // namespace nvio::detail
