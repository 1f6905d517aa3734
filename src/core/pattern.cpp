#include "nvio/pattern.hpp"

#include <cstring>

namespace nvio::pattern {
namespace {

// splitmix64's multiplier: makes seeds differ in every byte of the word.
constexpr std::uint64_t kSeedMix = 0x9E3779B97F4A7C15ULL;

std::uint8_t byte_at(std::uint64_t file_offset, std::uint64_t seed) noexcept {
  const std::uint64_t word = word_at(file_offset & ~std::uint64_t{7}, seed);
  return static_cast<std::uint8_t>(word >> (8 * (file_offset & 7)));
}

}  // namespace

std::uint64_t word_at(std::uint64_t word_offset, std::uint64_t seed) noexcept {
  return word_offset ^ (seed * kSeedMix);
}

void fill(void* buf, std::size_t len, std::uint64_t file_offset, std::uint64_t seed) noexcept {
  auto* out = static_cast<std::uint8_t*>(buf);
  std::size_t i = 0;
  for (; i < len && ((file_offset + i) & 7) != 0; ++i) {
    out[i] = byte_at(file_offset + i, seed);
  }
  for (; i + 8 <= len; i += 8) {
    const std::uint64_t word = word_at(file_offset + i, seed);
    std::memcpy(out + i, &word, 8);  // little-endian: byte k of the word is at offset + k
  }
  for (; i < len; ++i) {
    out[i] = byte_at(file_offset + i, seed);
  }
}

std::optional<std::uint64_t> first_mismatch(const void* buf, std::size_t len,
                                            std::uint64_t file_offset,
                                            std::uint64_t seed) noexcept {
  const auto* in = static_cast<const std::uint8_t*>(buf);
  std::size_t i = 0;
  for (; i < len && ((file_offset + i) & 7) != 0; ++i) {
    if (in[i] != byte_at(file_offset + i, seed)) return file_offset + i;
  }
  for (; i + 8 <= len; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, in + i, 8);
    if (word != word_at(file_offset + i, seed)) {
      for (std::size_t k = 0; k < 8; ++k) {
        if (in[i + k] != byte_at(file_offset + i + k, seed)) return file_offset + i + k;
      }
    }
  }
  for (; i < len; ++i) {
    if (in[i] != byte_at(file_offset + i, seed)) return file_offset + i;
  }
  return std::nullopt;
}

}  // namespace nvio::pattern
