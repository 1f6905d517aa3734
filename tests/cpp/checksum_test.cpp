// nvio::crc32 and crc32_combine against a bit-at-a-time reference written from the definition
// (reflected polynomial 0xEDB88320, initial and final inversion), over odd sizes and unaligned
// starts, and the combine of pieces against the CRC of the whole, past 4 GiB.
#include "nvio/checksum.hpp"

#include <random>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

std::uint32_t reference_crc32(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

TEST(Checksum, KnownValues) {
  const char* check = "123456789";  // the standard check input of CRC-32/ISO-HDLC
  EXPECT_EQ(nvio::crc32(check, 9), 0xCBF43926u);
  EXPECT_EQ(nvio::crc32(nullptr, 0), 0u);
  EXPECT_EQ(nvio::crc32(nullptr, 0, 0x12345678u), 0x12345678u);
}

TEST(Checksum, MatchesTheDefinitionAtOddSizesAndStarts) {
  const std::vector<unsigned char> data = random_bytes((1 << 20) + 123 + 64, 7);
  for (std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{4095},
                           std::size_t{4096}, std::size_t{65537}, std::size_t{(1 << 20) + 123}}) {
    for (std::size_t start : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{64}}) {
      ASSERT_EQ(nvio::crc32(data.data() + start, size), reference_crc32(data.data() + start, size))
          << "size " << size << " start " << start;
    }
  }
}

TEST(Checksum, ChainingAndCombiningPiecesGiveTheWhole) {
  const std::vector<unsigned char> data = random_bytes(300000, 11);
  const std::uint32_t whole = reference_crc32(data.data(), data.size());
  std::mt19937 rng(3);
  for (int round = 0; round < 50; ++round) {
    const std::size_t cut = round == 0 ? 0 : round == 1 ? data.size() : rng() % data.size();
    const std::uint32_t a = nvio::crc32(data.data(), cut);
    const std::uint32_t b = nvio::crc32(data.data() + cut, data.size() - cut);
    ASSERT_EQ(nvio::crc32(data.data() + cut, data.size() - cut, a), whole) << "cut " << cut;
    ASSERT_EQ(nvio::crc32_combine(a, b, data.size() - cut), whole) << "cut " << cut;
  }
}

TEST(Checksum, CombinePastFourGiB) {
  // B is 4 GiB + 3 MiB of zeros (a length that a 32-bit size would wrap), A a few bytes: the
  // combined CRC must equal chaining B's bytes after A's.
  const std::vector<unsigned char> zeros(1 << 20, 0);
  const std::uint64_t size_b = (std::uint64_t{4} << 30) + (3 << 20);
  const unsigned char a_bytes[] = {1, 2, 3, 4, 5};
  const std::uint32_t a = nvio::crc32(a_bytes, sizeof a_bytes);
  std::uint32_t b = 0;
  std::uint32_t chained = a;
  for (std::uint64_t done = 0; done < size_b; done += zeros.size()) {
    b = nvio::crc32(zeros.data(), zeros.size(), b);
    chained = nvio::crc32(zeros.data(), zeros.size(), chained);
  }
  EXPECT_EQ(nvio::crc32_combine(a, b, size_b), chained);
  EXPECT_NE(nvio::crc32_combine(a, b, size_b), nvio::crc32_combine(a, b, size_b & 0xFFFFFFFFu));
}

}  // namespace
}  // namespace nvio_test
