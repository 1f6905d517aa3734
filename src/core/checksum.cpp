#include "nvio/checksum.hpp"

#include <isa-l/crc.h>
#include <zlib.h>

// With _FILE_OFFSET_BITS=64, zlib.h renames crc32_combine to crc32_combine64 by a macro, which
// would also rename nvio's function below: call the 64-bit name directly then.
#ifdef crc32_combine
#undef crc32_combine
#define NVIO_ZLIB_CRC32_COMBINE ::crc32_combine64
#else
#define NVIO_ZLIB_CRC32_COMBINE ::crc32_combine
#endif

namespace nvio {

std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) noexcept {
  // crc32_gzip_refl takes and returns the finished (inverted) CRC, as zlib's crc32 does.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), size);
}

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                            std::uint64_t size_b) noexcept {
  // ISA-L has no combine; zlib's is a few dozen multiplications modulo the polynomial.
  static_assert(sizeof(z_off_t) == 8, "a 64-bit z_off_t, for records of 4 GiB and more");
  return static_cast<std::uint32_t>(
      NVIO_ZLIB_CRC32_COMBINE(crc_a, crc_b, static_cast<z_off_t>(size_b)));
}

}  // namespace nvio
