// Cached reads (cached_reads=auto, src/handle/residency.hpp), per engine: reads of files fully,
// partly and not at all in the page cache return the file's bytes, into buffers of every kind at
// unaligned offsets; cached pieces go through the page cache (HandleStats::cached_bytes) and cold
// ones stay direct (they leave no pages behind); writes are unaffected; the mincore fallback
// decides as cachestat does.
#include "handle/residency.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::CachedReads;
using nvio::DirectIo;
using nvio::Handle;
using nvio::Options;

constexpr std::size_t kFileSize = 8 * MiB + 12345;  // odd: the last page is partial
constexpr std::uint64_t kOddOffset = 4096 + 17;
constexpr std::uint64_t kSeed = 77;

// Ranges [first, second) of the file to bring into the page cache.
using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

// Brings exactly `ranges` of `path` into the page cache, clean: a descriptor with readahead off
// (POSIX_FADV_RANDOM) reads them.
void cache_ranges(const std::string& path, const Ranges& ranges) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  std::vector<unsigned char> scratch;
  for (const auto& [from, to] : ranges) {
    scratch.resize(static_cast<std::size_t>(to - from));
    ASSERT_EQ(::pread(fd, scratch.data(), scratch.size(), static_cast<off_t>(from)),
              static_cast<ssize_t>(scratch.size()));
  }
  ::close(fd);
}

class Residency : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped()) return;
    if (!direct_supported()) {
      GTEST_SKIP() << "O_DIRECT does not work in " << dir() << ": " << direct_info().source;
    }
    path_ = file("cached.bin");
    write_pattern_file(path_, kFileSize, kSeed);
  }

  Options options(CachedReads cached = CachedReads::Auto) const {
    Options o = base_options();
    o.direct = DirectIo::Auto;
    o.cached_reads = cached;
    return o;
  }

  // A cold file: skips the test where its pages cannot be dropped (cold pieces then look cached).
  void make_cold() {
    drop_cache(path_);
    if (resident_pages(path_, 0, kFileSize) != 0) {
      GTEST_SKIP() << "cannot drop the page cache of " << path_;
    }
  }

  // Reads [off, off + len) with `h` into a `kind` buffer and compares every byte; returns the
  // handle's cached_bytes for the read.
  std::uint64_t read_and_check(Handle& h, std::uint64_t off, std::size_t len, BufKind kind) {
    SCOPED_TRACE(::testing::Message()
                 << "length " << len << " at " << off << ", buffer " << to_string(kind));
    GuardedBuffer b(len, kind);
    b.fill_sentinel();
    const nvio::HandleStats before = h.stats();
    h.read(b.data(), len, path_, off);
    EXPECT_TRUE(buffer_has_pattern(b.data(), len, off, kSeed));
    EXPECT_TRUE(b.guards_intact());
    nvio::HandleStats d = h.stats();
    d -= before;
    EXPECT_EQ(d.bytes_read, len);
    return d.cached_bytes;
  }

  std::string path_;
};

TEST_P(Residency, FullyCachedReadsGoThroughThePageCache) {
  cache_ranges(path_, {{0, kFileSize}});
  Handle h(options());
  for (BufKind kind : kAllBufKinds) {
    EXPECT_EQ(read_and_check(h, 0, kFileSize, kind), kFileSize);
    EXPECT_EQ(read_and_check(h, kOddOffset, kFileSize - kOddOffset - 3, kind),
              kFileSize - kOddOffset - 3);
  }
}

TEST_P(Residency, ColdReadsStayDirect) {
  make_cold();
  Handle h(options());
  for (BufKind kind : {BufKind::Aligned, BufKind::Plus3}) {
    EXPECT_EQ(read_and_check(h, kOddOffset, 6 * MiB + 1, kind), 0u);
  }
  // Direct reads leave the middle uncached (the edges go through the page cache).
  EXPECT_EQ(resident_pages(path_, 2 * MiB, 2 * MiB), 0u);
}

TEST_P(Residency, PartlyCachedReadsTakeTheCachedPiecesOnly) {
  // The read at kOddOffset is split at 4 KiB (ext4) or more: its middle pieces start at P(0) and
  // are block_size (1 MiB) long; a piece is read cached when all of its pages are.
  const std::uint64_t align = std::max<std::uint64_t>(direct_info().offset_align, 4096);
  const std::uint64_t first = (kOddOffset + align - 1) / align * align;
  const auto P = [&](std::uint64_t k) { return first + k * MiB; };
  const std::vector<std::pair<const char*, Ranges>> layouts = {
      {"cached head and tail, cold middle", {{0, P(3)}, {P(6), kFileSize}}},
      {"cold head and tail, cached middle", {{P(2), P(5)}}},
      {"alternating pieces", {{P(0), P(1)}, {P(2), P(3)}, {P(4), P(5)}, {P(6), P(7)}}},
      {"odd page-crossing ranges", {{4095, MiB + 4097}, {3 * MiB + 100, 5 * MiB + 7}}},
  };
  for (const auto& [name, ranges] : layouts) {
    SCOPED_TRACE(name);
    for (BufKind kind : {BufKind::Aligned, BufKind::Plus1, BufKind::Vector}) {
      make_cold();
      if (IsSkipped()) return;
      cache_ranges(path_, ranges);
      Handle h(options());
      const std::uint64_t cached = read_and_check(h, kOddOffset, kFileSize - kOddOffset, kind);
      EXPECT_GT(cached, 0u);
      EXPECT_LT(cached, kFileSize - kOddOffset);
    }
  }
  // A cold middle piece was read direct: it is still not in the page cache.
  make_cold();
  cache_ranges(path_, layouts[0].second);
  Handle h(options());
  EXPECT_EQ(read_and_check(h, kOddOffset, kFileSize - kOddOffset, BufKind::Aligned),
            (P(3) - P(0)) + (P(8) - P(6)) + (kFileSize / align * align - P(8)));
  EXPECT_EQ(resident_pages(path_, P(4), MiB), 0u);
}

TEST_P(Residency, OffSmallAndDirectOnReadsStayDirect) {
  cache_ranges(path_, {{0, kFileSize}});
  Handle off(options(CachedReads::Off));
  EXPECT_EQ(read_and_check(off, kOddOffset, 4 * MiB, BufKind::Aligned), 0u);
  Handle h(options());
  EXPECT_EQ(read_and_check(h, 4096, nvio::detail::kMinProbedRead - 4096, BufKind::Aligned), 0u)
      << "a small read is not probed";
  Options on = options();
  on.direct = DirectIo::On;
  Handle hon(on);
  EXPECT_EQ(read_and_check(hon, 0, 4 * MiB, BufKind::Aligned), 0u) << "direct=on is O_DIRECT";
}

TEST_P(Residency, MincoreFallbackDecidesAsCachestat) {
  const auto previous =
      nvio::detail::set_residency_probe_for_testing(nvio::detail::ResidencyProbe::Mincore);
  struct Restore {
    nvio::detail::ResidencyProbe p;
    ~Restore() { nvio::detail::set_residency_probe_for_testing(p); }
  } restore{previous};
  Handle h(options());
  cache_ranges(path_, {{0, kFileSize}});
  EXPECT_EQ(read_and_check(h, kOddOffset, 5 * MiB, BufKind::Plus3), 5 * MiB);
  make_cold();
  if (IsSkipped()) return;
  EXPECT_EQ(read_and_check(h, kOddOffset, 5 * MiB, BufKind::Plus3), 0u);
  cache_ranges(path_, {{0, 3 * MiB}});
  const std::uint64_t cached = read_and_check(h, 0, 6 * MiB, BufKind::Aligned);
  EXPECT_EQ(cached, 3 * MiB);
}

TEST_P(Residency, BatchesAndOpenedFilesReadCachedExtents) {
  cache_ranges(path_, {{0, kFileSize}});
  Handle h(options());
  GuardedBuffer a(3 * MiB + 5, BufKind::Plus1);
  GuardedBuffer b(2 * MiB, BufKind::Aligned);
  const std::vector<nvio::ReadExtent> extents = {{a.data(), a.size(), kOddOffset, path_},
                                                 {b.data(), b.size(), 5 * MiB, path_}};
  h.read_batch(extents);
  EXPECT_TRUE(buffer_has_pattern(a.data(), a.size(), kOddOffset, kSeed));
  EXPECT_TRUE(buffer_has_pattern(b.data(), b.size(), 5 * MiB, kSeed));
  EXPECT_EQ(h.stats().cached_bytes, a.size() + b.size());

  nvio::File f(h, path_);
  GuardedBuffer c(4 * MiB + 1, BufKind::Vector);
  c.fill_sentinel();
  f.read(c.data(), c.size(), 7);
  EXPECT_TRUE(buffer_has_pattern(c.data(), c.size(), 7, kSeed));
  EXPECT_EQ(h.stats().cached_bytes, a.size() + b.size() + c.size());
}

// A direct write over cached pages leaves none stale: the read after it, through the page cache
// or not, returns the new bytes. Writes themselves never take the cached path.
TEST_P(Residency, ReadAfterDirectWriteOverCachedPagesIsFresh) {
  cache_ranges(path_, {{0, kFileSize}});
  Handle h(options());
  constexpr std::uint64_t kNewSeed = kSeed + 1;
  const std::uint64_t off = 2 * MiB;
  const std::size_t len = 3 * MiB + 77;
  GuardedBuffer w(len, BufKind::Aligned);
  w.fill_pattern(off, kNewSeed);
  h.write(w.data(), len, path_, off);
  EXPECT_EQ(h.stats().cached_bytes, 0u) << "a write counted as a cached read";
  // The bytes before it are still cached and old; the write's range holds the new ones.
  GuardedBuffer r(kFileSize, BufKind::Plus3);
  r.fill_sentinel();
  h.read(r.data(), kFileSize, path_, 0);
  EXPECT_TRUE(buffer_has_pattern(r.data(), off, 0, kSeed));
  EXPECT_TRUE(buffer_has_pattern(r.data() + off, len, off, kNewSeed));
  EXPECT_TRUE(buffer_has_pattern(r.data() + off + len, kFileSize - off - len, off + len, kSeed));
  EXPECT_TRUE(file_range_has_pattern(read_file(path_), off, len, kNewSeed));
  // Asynchronous: the read submitted once the write has finished.
  w.fill_pattern(off, kNewSeed + 1);
  h.wait(h.submit_write(w.data(), len, path_, off));
  r.fill_sentinel();
  h.wait(h.submit_read(r.data() + off, len, path_, off));
  EXPECT_TRUE(buffer_has_pattern(r.data() + off, len, off, kNewSeed + 1));
}

INSTANTIATE_TEST_SUITE_P(Engines, Residency, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace
}  // namespace nvio_test
