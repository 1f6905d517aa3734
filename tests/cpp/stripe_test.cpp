// StripedHandle: bytes land where the layout says, in every part file, over every engine; sizes,
// gaps, truncation and errors; two RAM-backed loop mounts as two drives.
#include "nvio/stripe.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "nvio/errors.hpp"
#include "nvio/pattern.hpp"
#include "nvio/tune.hpp"
#include "test_util.hpp"

using namespace nvio_test;
using nvio::StripedHandle;
using nvio::StripeLayout;

namespace {

constexpr std::uint64_t kSeed = 0x57219e;
constexpr std::size_t kStripe = 64 * KiB;

// The logical file offset that part `drive`'s byte `part_offset` holds.
std::uint64_t logical_offset(const StripeLayout& l, std::size_t drive, std::uint64_t part_offset) {
  const std::uint64_t n = l.directories.size();
  const std::uint64_t k = (part_offset / l.stripe_size) * n + drive;
  return k * l.stripe_size + part_offset % l.stripe_size;
}

// Checks every byte of every part file against the pattern of the logical offset it holds,
// independently of nvio's own reading: a read that undid a wrong layout would pass a round trip.
::testing::AssertionResult parts_hold_pattern(const StripedHandle& h, const std::string& name,
                                              std::uint64_t size) {
  const StripeLayout& l = h.layout();
  for (std::size_t d = 0; d < l.directories.size(); ++d) {
    // A part that would hold nothing may be missing.
    const std::string path = h.part_path(d, name);
    const std::vector<unsigned char> part =
        file_size(path) < 0 ? std::vector<unsigned char>{} : read_file(path);
    if (part.size() != l.part_size(d, size)) {
      return ::testing::AssertionFailure() << "part " << d << " holds " << part.size()
                                           << " bytes, expected " << l.part_size(d, size);
    }
    for (std::uint64_t at = 0; at < part.size(); at += l.stripe_size) {
      const std::size_t len = std::min<std::size_t>(l.stripe_size, part.size() - at);
      const std::uint64_t logical = logical_offset(l, d, at);
      std::vector<unsigned char> want(len);
      nvio::pattern::fill(want.data(), len, logical, kSeed);
      if (std::memcmp(want.data(), part.data() + at, len) != 0) {
        return ::testing::AssertionFailure()
               << "part " << d << " at " << at << " does not hold logical offset " << logical;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::string> dir_paths(const std::vector<std::unique_ptr<TempDir>>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) out.push_back(d->path());
  return out;
}

std::vector<std::unique_ptr<TempDir>> make_dirs(std::size_t n) {
  std::vector<std::unique_ptr<TempDir>> dirs;
  for (std::size_t i = 0; i < n; ++i) dirs.push_back(std::make_unique<TempDir>());
  return dirs;
}

}  // namespace

TEST(StripeLayout, PartSizesAddUpAndFollowTheStripes) {
  for (std::size_t n : {1, 2, 3, 5}) {
    StripeLayout l{std::vector<std::string>(n, "d"), 4096};
    for (std::uint64_t size :
         {0ULL, 1ULL, 4095ULL, 4096ULL, 4097ULL, 3 * 4096ULL + 5, 17 * 4096ULL, 1000003ULL}) {
      std::uint64_t sum = 0;
      for (std::size_t d = 0; d < n; ++d) sum += l.part_size(d, size);
      EXPECT_EQ(sum, size) << n << " drives, " << size << " bytes";
      // The drive holding the last byte holds the partial stripe; a part never shrinks as the
      // file grows.
      for (std::size_t d = 0; d < n; ++d) EXPECT_LE(l.part_size(d, size), l.part_size(d, size + 1));
    }
  }
  StripeLayout two{{"a", "b"}, 4096};
  EXPECT_EQ(two.part_size(0, 2 * 4096 + 10), 4096u + 10);
  EXPECT_EQ(two.part_size(1, 2 * 4096 + 10), 4096u);
  EXPECT_EQ(two.part_size(1, 4096 + 1), 1u);
}

TEST(StripeLayout, Validates) {
  EXPECT_THROW((StripeLayout{{}, 4096}.validate()), nvio::InvalidArgument);
  EXPECT_THROW((StripeLayout{{"a", "a"}, 4096}.validate()), nvio::InvalidArgument);
  EXPECT_THROW((StripeLayout{{""}, 4096}.validate()), nvio::InvalidArgument);
  EXPECT_THROW((StripeLayout{{std::string("a\0b", 3)}, 4096}.validate()), nvio::InvalidArgument);
  EXPECT_THROW((StripeLayout{{"a"}, 0}.validate()), nvio::InvalidArgument);
  EXPECT_THROW((StripeLayout{{"a"}, 4096 + 512}.validate()), nvio::InvalidArgument);
  EXPECT_NO_THROW((StripeLayout{{"a", "b"}, 8192}.validate()));
}

class StripeEngine : public EngineTest {
 protected:
  nvio::OptionOverrides overrides() const {
    nvio::OptionOverrides o;
    o.engine = kind();
    o.direct = base_options().direct;
    o.block_size = 16 * KiB;  // several pieces per stripe
    o.queue_depth = 4;
    o.intra_op_parallelism = 2;
    return o;
  }
};

// Odd sizes, unaligned offsets and buffers, one to three drives: the parts hold the layout's
// bytes, a read gives them back whole and in sub-ranges, and each drive reports its share.
TEST_P(StripeEngine, RoundTripsByteExactOverEveryDriveCount) {
  for (std::size_t n : {1, 2, 3}) {
    auto dirs = make_dirs(n);
    StripedHandle h(StripeLayout{dir_paths(dirs), kStripe}, overrides());
    for (std::size_t size : {std::size_t{1}, std::size_t{4095}, 3 * kStripe + 123, MiB + 123}) {
      SCOPED_TRACE(::testing::Message() << n << " drives, " << size << " bytes");
      GuardedBuffer out(size, BufKind::Plus3);
      out.fill_pattern(0, kSeed);
      const nvio::StripedTransfer w =
          h.write(out.data(), size, "f", 0, {.truncate = nvio::Truncate::AtEnd});
      ASSERT_EQ(w.bytes, size);
      ASSERT_EQ(w.drives.size(), n);
      for (std::size_t d = 0; d < n; ++d) {
        EXPECT_EQ(w.drives[d].bytes, h.layout().part_size(d, size));
        EXPECT_EQ(w.drives[d].directory, dirs[d]->path());
        EXPECT_LE(w.drives[d].seconds, w.seconds);
      }
      EXPECT_EQ(h.size("f"), size);
      EXPECT_TRUE(parts_hold_pattern(h, "f", size));

      GuardedBuffer in(size, BufKind::Plus1);
      in.fill_sentinel();
      const nvio::StripedTransfer r = h.read(in.data(), size, "f");
      EXPECT_EQ(r.bytes, size);
      EXPECT_TRUE(buffer_has_pattern(in.data(), size, 0, kSeed));
      EXPECT_TRUE(in.guards_intact());

      // A sub-range that starts and ends inside stripes, from an unaligned buffer.
      if (size > kStripe + 200) {
        const std::uint64_t off = kStripe - 77;
        const std::size_t len = size - off - 100;
        GuardedBuffer part(len, BufKind::Plus4095);
        part.fill_sentinel();
        h.read(part.data(), len, "f", off);
        EXPECT_TRUE(buffer_has_pattern(part.data(), len, off, kSeed));
        EXPECT_TRUE(part.guards_intact());
      }
    }
    EXPECT_EQ(h.remove("f"), n);
    EXPECT_THROW(h.size("f"), nvio::FileNotFound);
  }
}

// An overwrite in the middle at an odd offset changes only its bytes; a write past the end leaves
// a gap that reads as zeros; Truncate::AtEnd shrinks every part.
TEST_P(StripeEngine, OverwriteGapAndTruncateKeepTheLayout) {
  auto dirs = make_dirs(3);
  StripedHandle h(StripeLayout{dir_paths(dirs), kStripe}, overrides());
  const std::size_t size = 5 * kStripe + 11;
  std::vector<unsigned char> buf(size);
  nvio::pattern::fill(buf.data(), size, 0, kSeed);
  h.write(buf.data(), size, "g");

  const std::uint64_t off = 2 * kStripe - 5;
  std::vector<unsigned char> patch(kStripe + 9, 0xEE);
  h.write(patch.data(), patch.size(), "g", off);
  std::memset(buf.data() + off, 0xEE, patch.size());
  EXPECT_EQ(h.size("g"), size);
  std::vector<unsigned char> back(size);
  h.read(back.data(), size, "g");
  EXPECT_EQ(back, buf);

  // Past the end: 3 stripes on, 10 bytes.
  const std::uint64_t far = size + 3 * kStripe + 1;
  std::vector<unsigned char> tail(10, 0x42);
  h.write(tail.data(), tail.size(), "g", far);
  ASSERT_EQ(h.size("g"), far + 10);
  std::vector<unsigned char> all(far + 10);
  h.read(all.data(), all.size(), "g");
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), all.begin()));
  EXPECT_TRUE(std::all_of(all.begin() + size, all.begin() + far, [](auto c) { return c == 0; }));
  EXPECT_TRUE(std::all_of(all.begin() + far, all.end(), [](auto c) { return c == 0x42; }));

  // Truncate::AtEnd to 1.5 stripes.
  const std::size_t small = kStripe + kStripe / 2;
  h.write(buf.data(), small, "g", 0, {.truncate = nvio::Truncate::AtEnd});
  EXPECT_EQ(h.size("g"), small);
  EXPECT_EQ(file_size(h.part_path(0, "g")), static_cast<std::int64_t>(kStripe));
  EXPECT_EQ(file_size(h.part_path(1, "g")), static_cast<std::int64_t>(kStripe / 2));
  EXPECT_EQ(file_size(h.part_path(2, "g")), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, StripeEngine, NVIO_ALL_ENGINES, EngineParamName());

TEST(StripedHandle, ErrorsNameWhatFailed) {
  auto dirs = make_dirs(2);
  const std::vector<std::string> paths = dir_paths(dirs);
  EXPECT_THROW(StripedHandle(StripeLayout{{paths[0], paths[0] + "/missing"}, kStripe}),
               nvio::FileNotFound);
  write_file(paths[1] + "/plain", "x", 1);
  EXPECT_THROW(StripedHandle(StripeLayout{{paths[0], paths[1] + "/plain"}, kStripe}),
               nvio::InvalidArgument);

  StripedHandle h(StripeLayout{paths, kStripe});
  std::vector<unsigned char> buf(3 * kStripe);
  nvio::pattern::fill(buf.data(), buf.size(), 0, kSeed);
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", std::string("a\0b", 3)}) {
    EXPECT_THROW(h.write(buf.data(), 10, bad), nvio::InvalidArgument) << bad;
    EXPECT_THROW(h.read(buf.data(), 10, bad), nvio::InvalidArgument) << bad;
  }
  EXPECT_THROW(h.read(buf.data(), 10, "none"), nvio::FileNotFound);

  h.write(buf.data(), buf.size(), "f");
  try {
    h.read(buf.data(), buf.size(), "f", 1);
    FAIL() << "read past the end";
  } catch (const nvio::ShortFile& e) {
    EXPECT_EQ(e.file_size(), buf.size());
    EXPECT_TRUE(contains(e.what(), "f (striped over " + paths[0]));
  }

  // The parts of a file of 1 stripe + 10 bytes, read with twice the stripe size, do not add up.
  h.write(buf.data(), kStripe + 10, "short", 0);
  StripedHandle other(StripeLayout{paths, 2 * kStripe});
  try {
    other.size("short");
    FAIL() << "another stripe size";
  } catch (const nvio::FormatError& e) {
    EXPECT_TRUE(contains(e.problem(), "stripe size"));
  }
  // A lost part is named as missing (the sizes alone would make the first part look too long).
  ASSERT_EQ(::unlink(h.part_path(1, "f").c_str()), 0);
  try {
    h.size("f");
    FAIL() << "a lost part";
  } catch (const nvio::FormatError& e) {
    EXPECT_TRUE(contains(e.problem(), h.part_path(1, "f") + " missing; its parts hold"))
        << e.what();
  }
  EXPECT_THROW(h.read(buf.data(), 10, "f"), nvio::FormatError);
}

// An empty write makes an empty striped file, as Handle makes an empty file: its size is 0, it
// reads as nothing, and it takes one part (the first); a write into it later grows it.
TEST(StripedHandle, AnEmptyWriteMakesAnEmptyFile) {
  auto dirs = make_dirs(3);
  StripedHandle h(StripeLayout{dir_paths(dirs), kStripe});
  h.write(nullptr, 0, "e", 0);
  EXPECT_EQ(h.size("e"), 0u);
  EXPECT_EQ(h.read(nullptr, 0, "e").bytes, 0u);
  EXPECT_EQ(::access(h.part_path(0, "e").c_str(), F_OK), 0);
  EXPECT_NE(::access(h.part_path(1, "e").c_str(), F_OK), 0);
  // An empty write at an offset grows nothing (pwrite of nothing does not either).
  h.write(nullptr, 0, "e", 5 * kStripe);
  EXPECT_EQ(h.size("e"), 0u);
  std::vector<unsigned char> buf(2 * kStripe + 7);
  nvio::pattern::fill(buf.data(), buf.size(), 0, kSeed);
  h.write(buf.data(), buf.size(), "e", 0);
  EXPECT_EQ(h.size("e"), buf.size());
  EXPECT_TRUE(parts_hold_pattern(h, "e", buf.size()));
}

// Parts whose sizes fit another layout too (equal halves) are still refused by it: each part
// records its place. A write that replaces the whole file may change the layout.
TEST(StripedHandle, PartsRecordTheirLayout) {
  auto dirs = make_dirs(2);
  const std::vector<std::string> paths = dir_paths(dirs);
  StripedHandle h(StripeLayout{paths, kStripe});
  std::vector<unsigned char> buf(4 * kStripe);
  nvio::pattern::fill(buf.data(), buf.size(), 0, kSeed);
  h.write(buf.data(), buf.size(), "f");

  StripedHandle swapped(StripeLayout{{paths[1], paths[0]}, kStripe});
  StripedHandle wider(StripeLayout{paths, 2 * kStripe});
  for (StripedHandle* other : {&swapped, &wider}) {
    try {
      other->read(buf.data(), buf.size(), "f");
      FAIL() << "read with another layout";
    } catch (const nvio::FormatError& e) {
      EXPECT_TRUE(contains(e.problem(), "part 0 of 2, stripe_size 65536"));
    }
    // A partial write with another layout would mix two layouts: refused too.
    EXPECT_THROW(other->write(buf.data(), 10, "f", 5), nvio::FormatError);
  }
  // Replacing the whole file under the wider layout is allowed and leaves it readable by it only.
  wider.write(buf.data(), buf.size(), "f", 0, {.truncate = nvio::Truncate::AtEnd});
  std::vector<unsigned char> back(buf.size());
  wider.read(back.data(), back.size(), "f");
  EXPECT_EQ(back, buf);
  EXPECT_TRUE(parts_hold_pattern(wider, "f", buf.size()));
  EXPECT_THROW(h.read(back.data(), back.size(), "f"), nvio::FormatError);
}

// One drive's failure is reported after the other drive's batch finished, naming the part.
TEST(StripedHandle, AFailingDriveIsReportedWithItsPart) {
  auto dirs = make_dirs(2);
  StripedHandle h(StripeLayout{dir_paths(dirs), kStripe});
  std::vector<unsigned char> buf(4 * kStripe);
  nvio::pattern::fill(buf.data(), buf.size(), 0, kSeed);
  h.write(buf.data(), buf.size(), "f");
  // Part 1 becomes a directory: its drive's batch cannot open it.
  const std::string part1 = h.part_path(1, "f");
  ASSERT_EQ(::unlink(part1.c_str()), 0);
  ASSERT_EQ(::mkdir(part1.c_str(), 0755), 0);
  try {
    h.write(buf.data(), buf.size(), "f");
    FAIL() << "a part that is a directory";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.path(), part1);
  }
}

// Two RAM-backed ext4 file systems on loop devices, as two drives: the parts land on each.
TEST(StripedHandle, TwoLoopDevices) {
  std::string why;
  auto a = LoopMount::make("/dev/shm", 64 * MiB, &why);
  if (!a) GTEST_SKIP() << "no RAM-backed loop mount: " << why;
  auto b = LoopMount::make("/dev/shm", 64 * MiB, &why);
  if (!b) GTEST_SKIP() << "no second RAM-backed loop mount: " << why;
  StripedHandle h(StripeLayout{{a->path(), b->path()}, MiB});
  const std::size_t size = 16 * MiB + 123;
  nvio::AlignedBuffer out(size);
  nvio::pattern::fill(out.data(), size, 0, kSeed);
  const nvio::StripedTransfer w =
      h.write(out.data(), size, "f", 0, {.durability = nvio::Durability::Data});
  EXPECT_EQ(w.drives[0].bytes, 8 * MiB + 123);
  EXPECT_EQ(w.drives[1].bytes, 8 * MiB);
  EXPECT_TRUE(parts_hold_pattern(h, "f", size));
  drop_cache(h.part_path(0, "f"));
  drop_cache(h.part_path(1, "f"));
  nvio::AlignedBuffer in(size);
  h.read(in.data(), size, "f");
  EXPECT_TRUE(buffer_has_pattern(in.data(), size, 0, kSeed));
}

// Two threads writing different ranges of one new striped file: neither shrinks the part the other
// just grew (the sizing is judged under a lock on each part's current size), so both writes land.
TEST(StripedHandle, ConcurrentWritesOfDifferentRangesKeepBoth) {
  auto dirs = make_dirs(2);
  StripedHandle h(StripeLayout{dir_paths(dirs), 4096});
  std::vector<unsigned char> a(64 * KiB, 0x11);
  std::vector<unsigned char> b(64 * KiB, 0x22);
  const int rounds = kSanitizerBuild ? 100 : 1000;  // a race the old code lost about 1 in 1000
  for (int r = 0; r < rounds; ++r) {
    h.remove("f");
    std::thread t([&] { h.write(b.data(), b.size(), "f", 64 * KiB); });
    h.write(a.data(), a.size(), "f", 0);
    t.join();
    ASSERT_EQ(h.size("f"), 128 * KiB) << "round " << r;
    std::vector<unsigned char> back(128 * KiB);
    h.read(back.data(), back.size(), "f");
    ASSERT_TRUE(std::equal(a.begin(), a.end(), back.begin())) << "round " << r;
    ASSERT_TRUE(std::equal(b.begin(), b.end(), back.begin() + 64 * KiB)) << "round " << r;
  }
}

TEST(StripedHandle, RangesPastTheLargestOffsetAreRefused) {
  auto dirs = make_dirs(2);
  StripedHandle h(StripeLayout{dir_paths(dirs), 4096});
  std::vector<unsigned char> buf(8192, 1);
  h.write(buf.data(), buf.size(), "f");
  const std::uint64_t near_end = std::numeric_limits<std::uint64_t>::max() - 4095;
  EXPECT_THROW(h.read(buf.data(), buf.size(), "f", near_end), nvio::InvalidArgument);
  EXPECT_THROW(h.write(buf.data(), buf.size(), "f", near_end, {.truncate = nvio::Truncate::AtEnd}),
               nvio::InvalidArgument);
  EXPECT_EQ(h.size("f"), 8192u);  // untouched
}

TEST(StripedHandle, OneDirectoryUnderTwoSpellingsIsRefused) {
  TempDir d;
  const std::string link = d.path() + "-link";
  ASSERT_EQ(::symlink(d.path().c_str(), link.c_str()), 0);
  EXPECT_THROW(StripedHandle(StripeLayout{{d.path(), d.path() + "/"}, 4096}),
               nvio::InvalidArgument);
  EXPECT_THROW(StripedHandle(StripeLayout{{d.path(), link}, 4096}), nvio::InvalidArgument);
  ::unlink(link.c_str());
}

// A write that fails leaves the file as readable as before: a Truncate::AtEnd write whose data
// cannot be read from the caller's memory (PROT_NONE: the kernel returns EFAULT) does not shrink
// the file first, and a write refused while sizing the parts puts back the parts it had resized.
TEST(StripedHandle, AFailedWriteKeepsTheFileReadable) {
  auto dirs = make_dirs(2);
  StripedHandle h(StripeLayout{dir_paths(dirs), 4096});
  std::vector<unsigned char> data(4 * 4096);
  nvio::pattern::fill(data.data(), data.size(), 0, kSeed);
  h.write(data.data(), data.size(), "f");

  void* none = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  EXPECT_THROW(h.write(none, 4096, "f", 0, {.truncate = nvio::Truncate::AtEnd}), nvio::IoError);
  ::munmap(none, 4096);
  EXPECT_EQ(h.size("f"), data.size());
  std::vector<unsigned char> back(data.size());
  h.read(back.data(), back.size(), "f");
  EXPECT_EQ(back, data);

  // "g": one stripe (part 1 missing); part 1's name taken by a directory, so growing "g" to three
  // stripes fails at part 1 after part 0 grew: part 0 must be back at one stripe.
  h.write(data.data(), 4096, "g");
  ASSERT_EQ(::mkdir(h.part_path(1, "g").c_str(), 0755), 0);
  EXPECT_THROW(h.write(data.data(), 2 * 4096, "g", 4096), nvio::IoError);
  EXPECT_EQ(file_size(h.part_path(0, "g")), 4096);
  // "n": new; part 0 is created, part 1 fails: part 0 is removed again.
  ASSERT_EQ(::mkdir(h.part_path(1, "n").c_str(), 0755), 0);
  EXPECT_THROW(h.write(data.data(), 2 * 4096, "n"), nvio::IoError);
  EXPECT_EQ(file_size(h.part_path(0, "n")), -1);
}

// nvio tune's measurement of several drives together: chunks smaller than the file (and a last,
// partial one), every mode, the bytes checked by its first read pass, nothing left behind.
TEST(StripedTune, MeasuresAFileLargerThanItsChunksAndRemovesIt) {
  auto dirs = make_dirs(2);
  nvio::StripedTuneRequest req;
  req.directories = dir_paths(dirs);
  req.options = {nvio::Options{}, nvio::Options{}};
  req.options[1].queue_depth = 4;
  req.stripe_size = 64 * KiB;
  req.file_size = MiB + 123;
  req.chunk_bytes = 300 * KiB;  // two rows of stripes per chunk: 256 KiB
  req.repeats = 2;
  const nvio::StripedTuneResult r = nvio::measure_striped(req);
  ASSERT_EQ(r.modes.size(), 2u);
  EXPECT_EQ(r.modes[0].mode, nvio::TuneMode::Write);  // writes first, so that reads find the file
  for (const nvio::StripedModeResult& m : r.modes) {
    EXPECT_GT(m.gbps, 0);
    EXPECT_EQ(m.all_gbps.size(), 2u);
    ASSERT_EQ(m.drive_gbps.size(), 2u);
    EXPECT_GT(m.drive_gbps[0], 0);
    EXPECT_GT(m.drive_gbps[1], 0);
  }
  for (const auto& d : dirs) {
    EXPECT_EQ(::rmdir(d->path().c_str()), 0) << d->path() << " is not empty";
    ASSERT_EQ(::mkdir(d->path().c_str(), 0755), 0);
  }
  req.repeats = 0;
  EXPECT_THROW(nvio::measure_striped(req), nvio::InvalidArgument);
}
