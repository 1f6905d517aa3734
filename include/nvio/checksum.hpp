// CRC-32 as zip, gzip and zlib define it (reflected polynomial 0xEDB88320, initial and final
// inversion), the checksum of every record of a torch.save archive. Computed with ISA-L's
// carry-less-multiply kernels (about 15-20 GB/s a core where zlib's table code gives 2), so that
// checking a checkpoint does not cap its save or load. Both functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// The CRC-32 of data[0, size) continuing from `crc`, the CRC of the bytes before it (0 for none):
// crc32(b, crc32(a, 0)) == crc32(a followed by b, 0), as zlib's crc32().
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept;

// The CRC-32 of A followed by B from crc_a = crc32(A), crc_b = crc32(B) and B's length, so that
// pieces of one record can be checksummed on different threads (zlib's crc32_combine).
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                            std::uint64_t size_b) noexcept;

}  // namespace nvio
NVIO_API_END
