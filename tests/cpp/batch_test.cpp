// Batched operations: many extents, of one file or of several, as one ticket; on every engine.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "handle/files.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;

// Extent sizes that exercise every plan shape: tiny, sub-page, page-crossing, multi-piece.
const std::size_t kSizes[] = {1, 4095, 4096, 64 * KiB + 3, MiB + 123, 7, 300 * KiB};

struct Layout {
  std::string path;
  std::uint64_t offset;
  std::size_t length;
  std::uint64_t seed;
};

class Batch : public EngineTest {
 protected:
  nvio::Options options() const {
    nvio::Options o = base_options();
    o.block_size = 128 * KiB;
    o.queue_depth = 8;
    o.intra_op_parallelism = 2;
    return o;
  }
  // Extents over two files, back to back with odd gaps, in an interleaved order.
  std::vector<Layout> layout(std::size_t count) const {
    std::vector<Layout> out;
    std::uint64_t next[2] = {17, 0};
    for (std::size_t i = 0; i < count; ++i) {
      const int f = static_cast<int>(i % 2);
      const std::size_t len = kSizes[i % std::size(kSizes)];
      out.push_back({file(f == 0 ? "a" : "b"), next[f], len, 1000 + i});
      next[f] += len + (i % 3 == 0 ? 4096 : i % 3);
    }
    return out;
  }
};

TEST_P(Batch, WritesAndReadsManyExtentsOfSeveralFilesAsOneOperation) {
  nvio::Handle h(options());
  const std::vector<Layout> lay = layout(40);
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::vector<nvio::WriteExtent> writes;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    bufs.push_back(std::make_unique<GuardedBuffer>(lay[i].length, kAllBufKinds[i % 5]));
    // Each extent's bytes encode their own file offset and a seed of their own.
    bufs.back()->fill_pattern(lay[i].offset, lay[i].seed);
    writes.push_back({bufs.back()->data(), lay[i].length, lay[i].offset, lay[i].path});
  }
  nvio::WriteOptions w;
  w.durability = nvio::Durability::Data;
  // Once first: the workers open what they keep (the bounce copier's probe pipe) on first use.
  h.write_batch(writes, w);
  EXPECT_EQ(h.open_files(), 2u) << "a and b, kept open for writing";
  const int fds_kept = open_fd_count();
  h.close_files();
  const int fds_before = open_fd_count();
  EXPECT_LT(fds_before, fds_kept);
  const nvio::Ticket t = h.submit_write_batch(writes, w);
  EXPECT_EQ(h.pending(), 1u);
  run_within(60s, "a write batch", [&] { h.wait(t); });
  EXPECT_EQ(open_fd_count(), fds_kept) << "descriptors leaked";
  const auto a = read_file(file("a"));
  const auto b = read_file(file("b"));
  for (const Layout& l : lay) {
    const auto& bytes = l.path == file("a") ? a : b;
    EXPECT_TRUE(file_range_has_pattern(bytes, l.offset, l.length, l.seed))
        << l.path << " at " << l.offset << " length " << l.length;
  }

  std::vector<nvio::ReadExtent> reads;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    bufs[i] = std::make_unique<GuardedBuffer>(lay[i].length, kAllBufKinds[(i + 2) % 5]);
    bufs[i]->fill_sentinel();
    reads.push_back({bufs[i]->data(), lay[i].length, lay[i].offset, lay[i].path});
  }
  run_within(60s, "a read batch", [&] { h.read_batch(reads); });
  for (std::size_t i = 0; i < lay.size(); ++i) {
    EXPECT_TRUE(buffer_has_pattern(bufs[i]->data(), lay[i].length, lay[i].offset, lay[i].seed))
        << "extent " << i;
    EXPECT_TRUE(bufs[i]->guards_intact()) << "extent " << i;
  }
  EXPECT_EQ(h.open_files(), 4u) << "a and b, for writing and for reading";
  h.close_files();
  EXPECT_EQ(h.open_files(), 0u);
  EXPECT_EQ(open_fd_count(), fds_before) << "descriptors leaked";
}

TEST_P(Batch, ExtentsByDescriptor) {
  nvio::Handle h(options());
  write_pattern_file(file("src"), 3 * MiB, 21);
  const int fd = ::open(file("src").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<std::vector<unsigned char>> bufs;
  std::vector<nvio::ReadExtent> reads;
  for (std::uint64_t off = 5; off + 100 * KiB < 3 * MiB; off += 211 * KiB) {
    bufs.emplace_back(100 * KiB);
    reads.push_back({bufs.back().data(), bufs.back().size(), off, fd});
  }
  h.read_batch(reads);
  for (std::size_t i = 0; i < reads.size(); ++i) {
    EXPECT_TRUE(buffer_has_pattern(bufs[i].data(), bufs[i].size(), reads[i].offset, 21));
  }
  EXPECT_EQ(::fcntl(fd, F_GETFD), 0) << "nvio closed the caller's descriptor";
  ::close(fd);
}

TEST_P(Batch, AnArgumentErrorStartsNothing) {
  nvio::Handle h(options());
  write_pattern_file(file("src"), MiB, 22);
  std::vector<unsigned char> x(MiB), y(MiB);
  // The second extent reads past the end: ShortFile before anything runs.
  std::vector<nvio::ReadExtent> reads = {{x.data(), 4096, 0, file("src")},
                                         {y.data(), 4096, MiB - 100, file("src")}};
  std::memset(x.data(), kSentinel, x.size());
  try {
    h.read_batch(reads);
    FAIL() << "no error";
  } catch (const nvio::ShortFile& e) {
    EXPECT_EQ(e.path(), file("src"));
    EXPECT_EQ(e.offset(), MiB - 100);
  }
  EXPECT_EQ(x[0], kSentinel) << "an extent ran although the batch was refused";
  EXPECT_EQ(h.pending(), 0u);
  // A null buffer, a missing file, truncate=at_end.
  reads[1] = {nullptr, 10, 0, file("src")};
  EXPECT_THROW(h.read_batch(reads), nvio::InvalidArgument);
  reads[1] = {y.data(), 10, 0, file("missing")};
  EXPECT_THROW(h.read_batch(reads), nvio::FileNotFound);
  nvio::WriteOptions w;
  w.truncate = nvio::Truncate::AtEnd;
  const std::vector<nvio::WriteExtent> writes = {{x.data(), 10, 0, file("w")}};
  EXPECT_THROW(h.write_batch(writes, w), nvio::InvalidArgument);
  // An empty batch is done at once.
  EXPECT_NO_THROW(h.wait(h.submit_read_batch({})));

  // A write batch refused for its second extent does not touch the file of its first, not even
  // to allocate the range past its end that a direct write gets first (docs/design.md).
  std::vector<unsigned char> z(2 * MiB, 9);
  const std::string fresh = file("fresh.bin");
  const std::vector<nvio::WriteExtent> refused = {{z.data(), z.size(), 0, fresh},
                                                  {nullptr, 10, 0, fresh}};
  EXPECT_THROW(h.write_batch(refused), nvio::InvalidArgument);
  struct stat st {};
  if (::stat(fresh.c_str(), &st) == 0) {
    EXPECT_EQ(st.st_size, 0) << "the refused batch grew the file";
    EXPECT_EQ(st.st_blocks, 0) << "the refused batch allocated blocks";
  }
}

// A direct write past the end of its file has that range allocated first (so that its pieces are
// not extending writes, which file systems serialise): only that range, never the hole before
// it, and without ever making the file shorter, whatever another writer does at the same time.
TEST_P(Batch, WritesPastTheEndAllocateOnlyTheirRangeAndNeverShrinkTheFile) {
  nvio::Handle h(options());
  const std::string sparse = file("sparse.bin");
  const std::uint64_t off = 64 * MiB + 7;
  GuardedBuffer buf(3 * MiB + 5, BufKind::Plus3);
  buf.fill_pattern(off, 31);
  h.write(buf.data(), buf.size(), sparse, off);
  EXPECT_EQ(file_size(sparse), static_cast<std::int64_t>(off + buf.size()));
  EXPECT_TRUE(file_range_has_pattern(read_file(sparse), off, buf.size(), 31));
  struct stat st {};
  ASSERT_EQ(::stat(sparse.c_str(), &st), 0);
  EXPECT_LT(static_cast<std::uint64_t>(st.st_blocks) * 512, 8 * MiB)
      << "the hole before the write was allocated";

  // Two threads extend one new file at once, the nearer range and the farther one in both orders:
  // the file ends where the farther write ends and holds both.
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    const std::string both = file("both" + std::to_string(round) + ".bin");
    GuardedBuffer near(2 * MiB + 1, BufKind::Aligned), far(2 * MiB + 3, BufKind::Plus1);
    near.fill_pattern(0, 41);
    far.fill_pattern(4 * MiB + 1, 42);
    std::thread a([&] { h.write(near.data(), near.size(), both, 0); });
    if (round % 2 == 0) std::this_thread::yield();
    std::thread b([&] { h.write(far.data(), far.size(), both, 4 * MiB + 1); });
    a.join();
    b.join();
    EXPECT_EQ(file_size(both), static_cast<std::int64_t>(4 * MiB + 1 + far.size()));
    const auto bytes = read_file(both);
    EXPECT_TRUE(file_range_has_pattern(bytes, 0, near.size(), 41));
    EXPECT_TRUE(file_range_has_pattern(bytes, 4 * MiB + 1, far.size(), 42));
  }
}

// allocate_past_end itself: with a size found stale (smaller than the file is now) it never makes
// the file shorter nor changes its bytes, as ftruncate would; past the end it allocates only the
// write's range; inside the file, on a directory or a block device, it does nothing.
TEST_P(Batch, AllocatingPastTheEndNeverShrinksAndSkipsTheHole) {
  using nvio::detail::allocate_past_end;
  using nvio::detail::Allocated;
  using nvio::detail::FileType;
  const std::string path = file("alloc.bin");
  write_pattern_file(path, 6 * MiB, 51);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const Allocated stale = allocate_past_end(fd, FileType::Regular, 0, 0, 2 * MiB);
  EXPECT_EQ(file_size(path), static_cast<std::int64_t>(6 * MiB));
  EXPECT_TRUE(file_range_has_pattern(read_file(path), 0, 6 * MiB, 51));
  EXPECT_EQ(allocate_past_end(fd, FileType::Regular, 6 * MiB, 0, 6 * MiB), Allocated::Nothing);
  EXPECT_EQ(allocate_past_end(fd, FileType::Block, 6 * MiB, 6 * MiB, 7 * MiB), Allocated::Nothing);
  struct stat before {};
  ASSERT_EQ(::fstat(fd, &before), 0);
  const Allocated past = allocate_past_end(fd, FileType::Regular, 6 * MiB, 70 * MiB, 71 * MiB);
  struct stat after {};
  ASSERT_EQ(::fstat(fd, &after), 0);
  ::close(fd);
  if (past == Allocated::Unsupported) GTEST_SKIP() << "no fallocate in " << dir();
  EXPECT_NE(stale, Allocated::Unsupported);
  ASSERT_EQ(past, Allocated::Range);
  EXPECT_EQ(after.st_size, static_cast<off_t>(71 * MiB));
  EXPECT_LE((after.st_blocks - before.st_blocks) * 512, 2 * MiB) << "the hole was allocated";
  EXPECT_TRUE(file_range_has_pattern(read_file(path), 0, 6 * MiB, 51));
}

// The range the FailingRangeEngine of these tests fails (engine_override.hpp).
constexpr std::uint64_t kBadBegin = 2 * MiB;
constexpr std::uint64_t kBadEnd = 2 * MiB + 1;
// A direct write into a new file whose last piece fails: the range was allocated before the
// pieces went out, so the file is as long as the write, and holds its bytes or zeros
// (docs/design.md).
TEST_P(Batch, AFailedWritePastTheEndLeavesItsRangeAllocated) {
  if (!direct_supported()) GTEST_SKIP() << "no O_DIRECT in " << dir() << ": nothing is allocated";
  ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new FailingRangeEngine(nvio::engine::make_backend_engine(k, qd), kBadBegin, kBadEnd));
  });
  nvio::Handle h(options());
  const std::string path = file("failed.bin");
  // Its last byte is in the failing range: only the allocation can make the file this long.
  GuardedBuffer buf(kBadEnd, BufKind::Aligned);
  buf.fill_pattern(0, 24);
  EXPECT_THROW(
      run_within(60s, "a failing write", [&] { h.write(buf.data(), buf.size(), path, 0); }),
      nvio::IoError);
  h.close_files();
  const std::string probe = file("probe.bin");
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const bool can = nvio::detail::allocate_past_end(fd, nvio::detail::FileType::Regular, 0, 0,
                                                   4096) != nvio::detail::Allocated::Unsupported;
  ::close(fd);
  if (!can) GTEST_SKIP() << "no fallocate in " << dir();
  const auto bytes = read_file(path);
  ASSERT_EQ(bytes.size(), kBadEnd);
  for (std::uint64_t at = 0; at < kBadBegin; at += 64 * KiB) {
    const bool zeros = file_range_is(bytes, at, at + 64 * KiB, 0);
    EXPECT_TRUE(zeros || file_range_has_pattern(bytes, at, 64 * KiB, 24)) << "at " << at;
  }
  EXPECT_TRUE(file_range_is(bytes, kBadBegin, kBadEnd, 0));
}

TEST_P(Batch, AFailingExtentFailsTheBatchNamingIt) {
  ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new FailingRangeEngine(nvio::engine::make_backend_engine(k, qd), kBadBegin, kBadEnd));
  });
  nvio::Handle h(options());
  write_pattern_file(file("src"), 4 * MiB, 23);
  std::vector<std::vector<unsigned char>> bufs;
  std::vector<nvio::ReadExtent> reads;
  for (std::uint64_t off = 0; off < 4 * MiB; off += MiB) {
    bufs.emplace_back(MiB);
    reads.push_back({bufs.back().data(), MiB, off, file("src")});
  }
  const nvio::Ticket t = h.submit_read_batch(reads);
  try {
    run_within(60s, "a failing batch", [&] { h.wait(t); });
    FAIL() << "a batch with a failed extent was reported as success";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.path(), file("src"));
    EXPECT_LE(e.offset(), kBadBegin);
    EXPECT_GT(e.offset() + e.length(), kBadBegin);
  }
  // The extents before the bad one were read in full.
  EXPECT_TRUE(buffer_has_pattern(bufs[0].data(), MiB, 0, 23));
  EXPECT_TRUE(buffer_has_pattern(bufs[1].data(), MiB, MiB, 23));
}

// wait_completion: a failure comes back in the Completion instead of being thrown, and `finished`
// is when the operation finished, not when the wait collected it.
TEST_P(Batch, WaitCompletionReturnsTheFailureAndWhenItFinished) {
  ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new FailingRangeEngine(nvio::engine::make_backend_engine(k, qd), kBadBegin, kBadEnd));
  });
  nvio::Handle h(options());
  write_pattern_file(file("src"), 4 * MiB, 31);
  std::vector<unsigned char> small(10);
  std::vector<unsigned char> big(4 * MiB);
  const auto start = std::chrono::steady_clock::now();
  const nvio::Ticket first = h.submit_read(small.data(), small.size(), file("src"));
  run_within(60s, "a small read", [&] {
    while (!h.done(first)) std::this_thread::yield();
  });
  std::this_thread::sleep_for(20ms);
  const auto second_submitted = std::chrono::steady_clock::now();
  const nvio::Ticket second = h.submit_read(big.data(), big.size(), file("src"));  // hits kBadBegin
  const nvio::Completion failed = h.wait_completion(second);
  const nvio::Completion ok = h.wait_completion(first);
  const auto end = std::chrono::steady_clock::now();
  EXPECT_EQ(failed.ticket, second);
  ASSERT_TRUE(failed.error);
  EXPECT_THROW(std::rethrow_exception(failed.error), nvio::IoError);
  EXPECT_GE(failed.finished, second_submitted);
  EXPECT_LE(failed.finished, end);
  EXPECT_FALSE(ok.error);
  EXPECT_GE(ok.finished, start);
  EXPECT_LT(ok.finished, second_submitted);  // collected last, finished first
  EXPECT_TRUE(buffer_has_pattern(small.data(), small.size(), 0, 31));
  EXPECT_THROW(h.wait_completion(first), nvio::InvalidArgument);
  // An empty batch finished when it was submitted, not at the clock's epoch.
  const auto before_empty = std::chrono::steady_clock::now();
  const nvio::Completion empty =
      h.wait_completion(h.submit_read_batch(std::span<const nvio::ReadExtent>{}));
  EXPECT_FALSE(empty.error);
  EXPECT_GE(empty.finished, before_empty);
  EXPECT_LE(empty.finished, std::chrono::steady_clock::now());
}

// wait_some: every ticket is collected exactly once, in bulk, with its own failure and without
// a throw; the others' bytes are right. Operations of very different sizes, so that completions
// come out of submission order.
TEST_P(Batch, WaitSomeCollectsEachCompletionOnceWithItsOwnFailure) {
  ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new FailingRangeEngine(nvio::engine::make_backend_engine(k, qd), kBadBegin, kBadEnd));
  });
  nvio::Handle h(options());
  write_pattern_file(file("src"), 4 * MiB, 29);
  struct Read {
    std::uint64_t offset;
    std::size_t length;
  };
  std::vector<Read> plan;
  for (std::uint64_t off = 0; off + MiB <= 4 * MiB; off += MiB) plan.push_back({off, MiB});
  for (std::uint64_t off = 7; off < MiB; off += 64 * KiB + 5) plan.push_back({off, 4095});
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::map<nvio::Ticket, std::size_t> index;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    bufs.push_back(std::make_unique<GuardedBuffer>(plan[i].length, kAllBufKinds[i % 5]));
    index[h.submit_read(bufs[i]->data(), plan[i].length, file("src"), plan[i].offset)] = i;
  }
  std::vector<nvio::Completion> out(5);
  std::set<nvio::Ticket> seen;
  std::size_t failures = 0;
  run_within(60s, "collecting with wait_some", [&] {
    while (seen.size() < plan.size()) {
      const std::size_t n = h.wait_some(out, 2);
      ASSERT_GE(n, std::min<std::size_t>(2, plan.size() - seen.size()));
      ASSERT_LE(n, out.size());
      for (std::size_t k = 0; k < n; ++k) {
        ASSERT_TRUE(index.contains(out[k].ticket)) << out[k].ticket;
        ASSERT_TRUE(seen.insert(out[k].ticket).second) << "collected twice: " << out[k].ticket;
        const Read& r = plan[index[out[k].ticket]];
        const bool bad = r.offset <= kBadBegin && kBadBegin < r.offset + r.length;
        if (bad) {
          ++failures;
          ASSERT_TRUE(out[k].error);
          EXPECT_THROW(std::rethrow_exception(out[k].error), nvio::IoError);
        } else {
          EXPECT_FALSE(out[k].error) << "read at " << r.offset;
          EXPECT_TRUE(
              buffer_has_pattern(bufs[index[out[k].ticket]]->data(), r.length, r.offset, 29));
        }
      }
    }
  });
  EXPECT_EQ(failures, 1u) << "the read over the bad range";
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.wait_some(out, 1), 0u) << "nothing outstanding: returns at once";
  EXPECT_EQ(h.wait(), 0u);
  // A collected ticket is gone.
  EXPECT_THROW(h.wait(index.begin()->first), nvio::InvalidArgument);
}

// An empty batch has finished at once: wait_some collects it rather than waiting for ever.
TEST_P(Batch, WaitSomeCollectsAnEmptyBatch) {
  nvio::Handle h(options());
  const nvio::Ticket t = h.submit_read_batch({});
  std::vector<nvio::Completion> out(4);
  std::size_t n = 0;
  run_within(20s, "wait_some for an empty batch", [&] { n = h.wait_some(out, 1); });
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(out[0].ticket, t);
  EXPECT_FALSE(out[0].error);
  EXPECT_EQ(h.pending(), 0u);
}

// wait_some beside wait(): two threads collecting the same handle's operations get each ticket
// exactly once between them, and neither hangs.
TEST_P(Batch, WaitSomeBesideWaitCollectsEachTicketOnce) {
  nvio::Handle h(options());
  write_pattern_file(file("src"), MiB, 31);
  std::vector<unsigned char> sink(4096 * 64);
  std::atomic<std::size_t> by_some{0};
  std::size_t by_wait = 0;
  std::size_t submitted = 0;
  run_within(60s, "wait_some beside wait", [&] {
    for (int round = 0; round < 20; ++round) {
      for (int i = 0; i < 64; ++i) {
        h.submit_read(sink.data() + 4096 * i, 4096, file("src"), 4096 * ((round * 7 + i) % 256));
        ++submitted;
      }
      std::thread other([&] {
        std::vector<nvio::Completion> out(16);
        for (int k = 0; k < 3; ++k) by_some += h.wait_some(out, 4);
      });
      by_wait += h.wait();
      other.join();
      by_wait += h.wait();
    }
  });
  EXPECT_EQ(by_some + by_wait, submitted);
}

INSTANTIATE_TEST_SUITE_P(Engines, Batch, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace
}  // namespace nvio_test
