// The offset-encoded verification pattern: its definition (little-endian words at multiples of 8),
// fills at unaligned offsets, and that first_mismatch finds exactly the corrupted byte.
#include <cstring>
#include <set>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

namespace pattern = nvio::pattern;

// The byte the pattern puts at file offset `off`, from word_at alone.
unsigned char expected_byte(std::uint64_t off, std::uint64_t seed) {
  const std::uint64_t w = pattern::word_at(off & ~std::uint64_t{7}, seed);
  return static_cast<unsigned char>(w >> (8 * (off & 7)));
}

TEST(Pattern, FillMatchesWordDefinition) {
  for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefull, ~0ull}) {
    std::vector<unsigned char> buf(4096);
    pattern::fill(buf.data(), buf.size(), 0, seed);
    for (std::size_t i = 0; i < buf.size(); ++i) {
      ASSERT_EQ(buf[i], expected_byte(i, seed)) << "offset " << i << " seed " << seed;
    }
    // Little-endian words.
    for (std::size_t w = 0; w < buf.size(); w += 8) {
      std::uint64_t v = 0;
      for (int b = 7; b >= 0; --b) v = (v << 8) | buf[w + static_cast<std::size_t>(b)];
      ASSERT_EQ(v, pattern::word_at(w, seed)) << "word at " << w;
    }
  }
}

TEST(Pattern, UnalignedOffsetsAndLengths) {
  const std::uint64_t seed = 42;
  const std::uint64_t bases[] = {0, 4096, (std::uint64_t{1} << 40) + 8, 0xfffffffffff000ull};
  for (std::uint64_t base : bases) {
    for (std::uint64_t start = 0; start < 17; ++start) {
      for (std::size_t len = 0; len < 41; ++len) {
        const std::uint64_t off = base + start;
        // Guarded destination: fill must write exactly len bytes.
        std::vector<unsigned char> buf(len + 16, 0xEE);
        pattern::fill(buf.data() + 8, len, off, seed);
        for (std::size_t i = 0; i < 8; ++i) {
          ASSERT_EQ(buf[i], 0xEE) << "fill wrote before the buffer";
          ASSERT_EQ(buf[8 + len + i], 0xEE) << "fill wrote past the buffer";
        }
        for (std::size_t i = 0; i < len; ++i) {
          ASSERT_EQ(buf[8 + i], expected_byte(off + i, seed))
              << "off " << off << " len " << len << " byte " << i;
        }
        EXPECT_EQ(pattern::first_mismatch(buf.data() + 8, len, off, seed), std::nullopt);
      }
    }
  }
}

TEST(Pattern, UnalignedBufferAddress) {
  std::vector<unsigned char> storage(1 << 16);
  for (std::size_t shift : {1u, 3u, 5u, 7u}) {
    unsigned char* p = storage.data() + shift;
    pattern::fill(p, 10000, 12345, 9);
    EXPECT_EQ(pattern::first_mismatch(p, 10000, 12345, 9), std::nullopt);
    for (std::size_t i = 0; i < 10000; i += 997) EXPECT_EQ(p[i], expected_byte(12345 + i, 9));
  }
}

TEST(Pattern, FindsOneFlippedByteAtItsOffset) {
  const std::size_t len = 100000;
  const std::uint64_t file_offset = 4096 + 17;
  std::vector<unsigned char> buf(len + 3);
  unsigned char* p = buf.data() + 3;  // unaligned
  pattern::fill(p, len, file_offset, 7);
  for (std::size_t pos : {std::size_t{0}, std::size_t{1}, std::size_t{6}, std::size_t{7},
                          std::size_t{8}, std::size_t{4095}, std::size_t{50001}, len - 1}) {
    for (unsigned char bit : {0x01, 0x80}) {
      p[pos] ^= bit;
      EXPECT_EQ(pattern::first_mismatch(p, len, file_offset, 7), file_offset + pos)
          << "flipped bit " << int(bit) << " of byte " << pos;
      p[pos] ^= bit;
    }
  }
  EXPECT_EQ(pattern::first_mismatch(p, len, file_offset, 7), std::nullopt);
  // Two corruptions: the first one is reported.
  p[70000] ^= 0xff;
  p[30000] ^= 0xff;
  EXPECT_EQ(pattern::first_mismatch(p, len, file_offset, 7), file_offset + 30000);
  // An empty range never mismatches.
  EXPECT_EQ(pattern::first_mismatch(p, 0, file_offset, 7), std::nullopt);
}

TEST(Pattern, ZeroedAndSentinelBuffersMismatchAtStart) {
  std::vector<unsigned char> zeros(4096, 0), sentinel(4096, kSentinel);
  for (std::uint64_t off : {0ull, 1ull, 4113ull}) {
    // A zero word or a run of sentinel bytes would defeat the checks of the other suites.
    auto z = pattern::first_mismatch(zeros.data(), zeros.size(), off, 3);
    auto s = pattern::first_mismatch(sentinel.data(), sentinel.size(), off, 3);
    ASSERT_TRUE(z.has_value());
    ASSERT_TRUE(s.has_value());
    EXPECT_LT(*z, off + 8);
    EXPECT_LT(*s, off + 8);
  }
}

TEST(Pattern, SeedsAndOffsetsDiffer) {
  const std::size_t words = 1 << 17;  // 1 MiB
  std::set<std::uint64_t> seen;
  std::size_t same_across_seeds = 0, same_as_next = 0;
  for (std::size_t i = 0; i < words; ++i) {
    const std::uint64_t off = i * 8;
    const std::uint64_t w1 = pattern::word_at(off, 1);
    seen.insert(w1);
    same_across_seeds += w1 == pattern::word_at(off, 2);
    same_as_next += w1 == pattern::word_at(off + 8, 1);
  }
  EXPECT_EQ(seen.size(), words) << "two offsets share a word: a shifted copy could go unseen";
  EXPECT_EQ(same_across_seeds, 0u) << "seeds 1 and 2 agree on some words";
  EXPECT_EQ(same_as_next, 0u);

  // A buffer of seed 1 checked against seed 2 fails in its first word; and a copy shifted by one
  // word fails in its first word.
  std::vector<unsigned char> buf(MiB);
  pattern::fill(buf.data(), buf.size(), 0, 1);
  auto m = pattern::first_mismatch(buf.data(), buf.size(), 0, 2);
  ASSERT_TRUE(m.has_value());
  EXPECT_LT(*m, 8u);
  m = pattern::first_mismatch(buf.data(), buf.size(), 8, 1);
  ASSERT_TRUE(m.has_value());
  EXPECT_LT(*m, 16u);
  // Large offsets and seeds: still distinct.
  EXPECT_NE(pattern::word_at(std::uint64_t{1} << 40, 5), pattern::word_at(0, 5));
  EXPECT_NE(pattern::word_at(8, 0), pattern::word_at(8, std::uint64_t{1} << 63));
}

TEST(Pattern, LargeBufferRoundTrip) {
  const std::size_t len = 64 * MiB + 7;
  GuardedBuffer b(len, BufKind::Plus3);
  b.fill_pattern(4096 + 17, 99);
  EXPECT_EQ(pattern::first_mismatch(b.data(), len, 4096 + 17, 99), std::nullopt);
  EXPECT_TRUE(b.guards_intact());
  b.data()[len - 1] ^= 1;
  EXPECT_EQ(pattern::first_mismatch(b.data(), len, 4096 + 17, 99), 4096 + 17 + len - 1);
}

}  // namespace
}  // namespace nvio_test
