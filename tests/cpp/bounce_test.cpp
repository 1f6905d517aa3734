// Bounced pieces: direct pieces whose memory is not aligned for O_DIRECT (a page-aligned buffer at
// an odd file offset) go through a worker's bounce chunks. The worker copies one chunk at a time
// between its calls of the engine, so that a chunk's request goes out before the next copy; with
// io_uring the chunks are the ring's registered buffers (READ_FIXED / WRITE_FIXED), and a kernel
// that refuses the registration costs nothing but the fixed ops. Every transfer is byte-compared
// with the offset pattern.
#include <fmt/format.h>
#include <liburing.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "fake_device.hpp"
#include "fault_engine.hpp"
#include "handle/plan.hpp"
#include "ring_spy.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::EngineKind;
using nvio::Handle;
using nvio::Options;
using nvio::engine::Completion;
using nvio::engine::Engine;
using nvio::engine::Request;

// A page-aligned buffer at file offset 4103: the head [4103, 8192) goes through the page cache,
// the middle's memory starts at buffer + 4089, which is not aligned, so every middle piece is
// bounced; the 123 bytes after the last whole page are the buffered tail.
constexpr std::uint64_t kOddOffset = 4096 + 7;
constexpr std::size_t kBlock = 64 * KiB;

// The caller's buffer a test transfers: requests pointing outside it go through a bounce chunk.
struct CallerRange {
  std::mutex mutex;
  const unsigned char* begin = nullptr;
  const unsigned char* end = nullptr;
  // Bounced requests in each submit() call, in order.
  std::vector<std::size_t> bounced_per_submit;
};

// Passes everything to `inner`, recording how many bounced requests each submit() carries.
class RecordingEngine final : public Engine {
 public:
  RecordingEngine(std::unique_ptr<Engine> inner, std::shared_ptr<CallerRange> range)
      : inner_(std::move(inner)), range_(std::move(range)) {}
  int submit(std::span<const Request> requests) override {
    std::lock_guard lock(range_->mutex);
    const std::size_t bounced =
        static_cast<std::size_t>(std::count_if(requests.begin(), requests.end(), [&](auto& r) {
          const auto* p = static_cast<const unsigned char*>(r.buf);
          return p < range_->begin || p >= range_->end;
        }));
    range_->bounced_per_submit.push_back(bounced);
    return inner_->submit(requests);
  }
  int reap(std::span<Completion> out, std::size_t min_complete) override {
    return inner_->reap(out, min_complete);
  }
  int cancel() override { return inner_->cancel(); }
  int add_region(void* base, std::size_t bytes) noexcept override {
    return inner_->add_region(base, bytes);
  }
  EngineKind kind() const noexcept override { return inner_->kind(); }

 private:
  std::unique_ptr<Engine> inner_;
  std::shared_ptr<CallerRange> range_;
};

class BouncedPieces : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped()) return;
    if (!direct_supported()) GTEST_SKIP() << "no O_DIRECT here: nothing is bounced";
  }
};

// psync completes every request inside submit(), so the order of the worker's steps shows in its
// submit() calls. Before the copies overlapped the I/O, a bounced write copied every chunk it
// could take (7 here) before submitting any, and a bounced read copied out every completion it
// reaped before submitting the next pieces together: the drive idled during the copies. Now
// each submit() of the write holds at most one bounced request, and a read of several pieces
// bounces none (it lands shifted, ShiftedRead).
class BounceOrder : public BouncedPieces {};

TEST_P(BounceOrder, EachChunkGoesToTheEngineBeforeTheNextCopy) {
  auto range = std::make_shared<CallerRange>();
  ScopedEngineFactory factory([range](EngineKind k, unsigned qd) -> std::unique_ptr<Engine> {
    return std::make_unique<RecordingEngine>(nvio::engine::make_backend_engine(k, qd), range);
  });
  Options o = base_options();
  o.block_size = kBlock;
  o.queue_depth = 8;
  Handle h(o);
  const std::size_t len = (8192 - kOddOffset) + 24 * kBlock + 123;
  GuardedBuffer buf(len, BufKind::Aligned);
  buf.fill_pattern(kOddOffset, 51);
  {
    std::lock_guard lock(range->mutex);
    range->begin = buf.data();
    range->end = buf.data() + len;
  }
  const std::string path = file("order.bin");
  ASSERT_NO_THROW(h.write(buf.data(), len, path, kOddOffset));
  EXPECT_TRUE(file_range_has_pattern(read_file(path), kOddOffset, len, 51));
  std::vector<std::size_t> writes;
  {
    std::lock_guard lock(range->mutex);
    writes.swap(range->bounced_per_submit);
  }
  EXPECT_EQ(std::accumulate(writes.begin(), writes.end(), std::size_t{0}), 24u);
  EXPECT_LE(*std::max_element(writes.begin(), writes.end()), 1u);

  // The read of the same lands shifted in the caller's buffer: of its requests only the tail's
  // goes to memory outside that buffer (the operation's own tail buffer), no bounce chunk.
  buf.fill_sentinel();
  ASSERT_NO_THROW(h.read(buf.data(), len, path, kOddOffset));
  EXPECT_TRUE(buffer_has_pattern(buf.data(), len, kOddOffset, 51));
  EXPECT_TRUE(buf.guards_intact());
  std::lock_guard lock(range->mutex);
  const std::vector<std::size_t>& reads = range->bounced_per_submit;
  EXPECT_EQ(std::accumulate(reads.begin(), reads.end(), std::size_t{0}), 1u);
}

// Odd offsets and sizes through bounce chunks that are reused many times (a queue depth of 4 has
// 4 chunks), one worker or several sharing the pieces of each operation.
TEST_P(BouncedPieces, OddOffsetsAndSizesRoundTrip) {
  constexpr std::size_t kLengths[] = {1, 4095, MiB + 123, 8 * MiB + 123};
  constexpr std::uint64_t kOffsets[] = {kOddOffset, 4095, 1};
  std::uint64_t seed = 700;
  // Parallelism 2 is left out under the sanitizers (kSanitizerBuild in test_util.hpp).
  for (const unsigned parallelism : {1u, 2u, 4u}) {
    if (kSanitizerBuild && parallelism == 2) continue;
    Options o = base_options();
    o.block_size = kBlock;
    o.queue_depth = 4;
    o.intra_op_parallelism = parallelism;
    Handle h(o);
    for (const std::size_t len : kLengths) {
      for (const std::uint64_t off : kOffsets) {
        SCOPED_TRACE(fmt::format("parallelism {}, length {} at offset {}", parallelism, len, off));
        const std::string path = file("odd.bin");
        ::unlink(path.c_str());
        GuardedBuffer wb(len, BufKind::Aligned);
        wb.fill_pattern(off, ++seed);
        ASSERT_NO_THROW(h.write(wb.data(), len, path, off));
        const auto bytes = read_file(path);
        ASSERT_EQ(bytes.size(), off + len);
        EXPECT_TRUE(file_range_has_pattern(bytes, off, len, seed));
        EXPECT_TRUE(file_range_is(bytes, 0, off, 0));
        GuardedBuffer rb(len, BufKind::Aligned);
        rb.fill_sentinel();
        ASSERT_NO_THROW(h.read(rb.data(), len, path, off));
        EXPECT_TRUE(buffer_has_pattern(rb.data(), len, off, seed));
        EXPECT_TRUE(rb.guards_intact());
      }
    }
  }
}

// ---- reads that land shifted in the caller's buffer (ShiftedRead) ---------------------------

// A read of several pieces into memory not aligned for O_DIRECT lands each piece a few bytes past
// its place in the caller's buffer and moves it there in file order. Its buffer here sits inside a
// larger one whose bytes around it must stay the sentinel: no landing or move may reach outside.
class ShiftedReads : public BouncedPieces {
 protected:
  void SetUp() override {
    BouncedPieces::SetUp();
    if (IsSkipped()) return;
    if (direct_info().mem_align <= 1) GTEST_SKIP() << "any address suits O_DIRECT here";
  }
  // Reads [off, off + len) of `path` (the pattern of `seed`) into the region `misalign` bytes past
  // a page of `outer`, checking the bytes on success and the bytes around the region always.
  // Returns whether the read succeeded.
  bool read_inside(Handle& h, GuardedBuffer& outer, std::size_t misalign, const std::string& path,
                   std::uint64_t off, std::size_t len, std::uint64_t seed) {
    outer.fill_sentinel();
    unsigned char* region = outer.data() + 4096 + misalign;
    bool ok = false;
    try {
      run_within(std::chrono::seconds(60), "a shifted read",
                 [&] { h.read(region, len, path, off); });
      ok = true;
      EXPECT_TRUE(buffer_has_pattern(region, len, off, seed));
    } catch (const nvio::IoError& e) {
      EXPECT_EQ(e.path(), path);
      EXPECT_GE(e.offset(), off);
      EXPECT_LE(e.offset() + e.length(), off + len);
    } catch (const nvio::Error& e) {
      EXPECT_TRUE(worker_may_die_) << e.what();  // a stopped worker names itself
    }
    if (!ok && !worker_may_die_) {
      // A failed read is over: nothing may still land or move anywhere in the buffer. (After a
      // worker stopped on an engine that cannot report completions, the kernel may still write
      // into the pieces' memory: docs/design.md, "Threads and ownership".)
      const std::vector<unsigned char> then(outer.data(), outer.data() + outer.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(std::equal(then.begin(), then.end(), outer.data()))
          << "bytes changed after the read reported its failure";
    }
    const auto untouched = [](const unsigned char* p, std::size_t n) {
      return std::all_of(p, p + n, [](unsigned char c) { return c == kSentinel; });
    };
    EXPECT_TRUE(untouched(outer.data(), 4096 + misalign)) << "bytes before the buffer changed";
    const unsigned char* after = region + len;
    EXPECT_TRUE(untouched(after, static_cast<std::size_t>(outer.data() + outer.size() - after)))
        << "bytes after the buffer changed";
    EXPECT_TRUE(outer.guards_intact());
    return ok;
  }
  // Whether a read of `path` at `off` into memory at page + `misalign` has a middle the kernel
  // refuses for O_DIRECT (so that it lands shifted).
  bool misaligned_middle(const std::string& path, std::uint64_t off, std::size_t misalign) const {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return false;
    const std::uint64_t align = nvio::detail::split_alignment(
        direct_info().offset_align, 4096, static_cast<std::uint64_t>(st.st_blksize));
    const std::uint64_t head = (align - off % align) % align;
    return (misalign + head) % direct_info().mem_align != 0;
  }
  // Many 16 KiB pieces per read (long chains), 8 in flight per worker.
  Options small_pieces(unsigned workers) const {
    Options o = base_options();
    o.block_size = 16 * KiB;
    o.queue_depth = 8;
    o.intra_op_parallelism = workers;
    return o;
  }
  bool worker_may_die_ = false;
};

TEST_P(ShiftedReads, LandInsideTheBufferAtEveryMisalignment) {
  constexpr std::size_t kLengths[] = {2 * kBlock + 4096, 3 * kBlock + 123, 4 * MiB + 5};
  constexpr std::uint64_t kOffsets[] = {0, 7, kOddOffset};
  const std::string path = file("shifted.bin");
  write_pattern_file(path, 4 * MiB + 5 + kOddOffset, 91);
  GuardedBuffer outer(4 * MiB + 5 + 3 * 4096, BufKind::Aligned);
  const std::size_t mem_align = direct_info().mem_align;
  for (const unsigned parallelism : {1u, 3u}) {
    Options o = base_options();
    o.block_size = kBlock;
    o.queue_depth = 4;
    o.intra_op_parallelism = parallelism;
    Handle h(o);
    for (const std::size_t misalign :
         {std::size_t{1}, std::size_t{7}, mem_align - 1, std::size_t{4095}}) {
      for (const std::uint64_t off : kOffsets) {
        for (const std::size_t len : kLengths) {
          // Memory the kernel would take as it is (the file offset's misalignment matches).
          if (!misaligned_middle(path, off, misalign)) continue;
          SCOPED_TRACE(fmt::format("parallelism {}, buffer at page + {}, {} bytes at {}",
                                   parallelism, misalign, len, off));
          const nvio::HandleStats before = h.stats();
          EXPECT_TRUE(read_inside(h, outer, misalign, path, off, len, 91));
          const nvio::HandleStats d = h.stats() - before;
          EXPECT_GT(d.shifted_bytes, 0u) << "the read did not land shifted";
          EXPECT_EQ(d.bounced_bytes, 0u);
        }
      }
    }
  }
}

// Completions held back and released in random order (pieces land before the ones ahead of them
// have moved), short transfers resumed inside a landing, and pieces failing in the middle of the
// chain: every read is right or an IoError, none hangs, no byte outside its buffer changes, and
// the handle goes on working.
TEST_P(ShiftedReads, ReorderedShortAndFailedPiecesNeverHangOrSpill) {
  FaultPlan plan;
  plan.hold_completion = 0.6;
  plan.short_transfer = 0.2;
  plan.request_error = 0.02;
  auto stats = std::make_shared<FaultStats>();
  ScopedEngineFactory factory(
      fault_engine_factory(plan, 4242 + static_cast<unsigned>(kind()), stats));
  const std::string path = file("chain.bin");
  constexpr std::size_t kMax = MiB;
  write_pattern_file(path, kMax + kOddOffset, 93);
  GuardedBuffer outer(kMax + 3 * 4096, BufKind::Aligned);
  Handle h(small_pieces(3));
  std::mt19937_64 rng(17);
  std::size_t ok = 0, failed = 0;
  for (int i = 0; i < (kSanitizerBuild ? 20 : 40); ++i) {
    const std::size_t len = 4 * 16 * KiB + rng() % (kMax - 4 * 16 * KiB);
    const std::uint64_t off = rng() % kOddOffset;
    const std::size_t misalign = 1 + rng() % 4094;
    SCOPED_TRACE(
        fmt::format("read {}: buffer at page + {}, {} bytes at {}", i, misalign, len, off));
    (read_inside(h, outer, misalign, path, off, len, 93) ? ok : failed) += 1;
  }
  EXPECT_GT(stats->count(Fault::HeldCompletion), 0u) << stats->describe();
  EXPECT_GT(stats->count(Fault::ShortTransfer), 0u) << stats->describe();
  EXPECT_GT(ok, 0u);
  EXPECT_GT(failed, 0u) << "no read failed: the chain's failure path was not exercised";
  EXPECT_GT(h.stats().shifted_bytes, 0u);
}

// An engine that stops reporting completions for good while shifted reads are in flight: the
// worker stops (its requests cannot be waited for; their memory, the operations' tail buffers
// included, is kept), every read fails with a typed error, none hangs, nothing spills.
TEST_P(ShiftedReads, AnEngineThatBreaksForGoodFailsThemCleanly) {
  FaultPlan plan = FaultPlan::everything();
  plan.reap_persistent_after = 3;
  auto stats = std::make_shared<FaultStats>();
  ScopedEngineFactory factory(
      fault_engine_factory(plan, 977 + static_cast<unsigned>(kind()), stats));
  worker_may_die_ = true;
  const std::string path = file("broken.bin");
  constexpr std::size_t kLen = 512 * KiB + 5;
  write_pattern_file(path, kLen + kOddOffset, 95);
  GuardedBuffer outer(kLen + 3 * 4096, BufKind::Aligned);
  const Options o = small_pieces(2);
  std::size_t failed = 0;
  for (int i = 0; i < 6; ++i) {
    Handle h(o);  // a fresh handle each time: one whose worker stopped runs nothing more
    SCOPED_TRACE(fmt::format("handle {}", i));
    if (!read_inside(h, outer, 1 + static_cast<std::size_t>(i) * 700, path, kOddOffset, kLen, 95)) {
      ++failed;
    }
  }
  EXPECT_GT(stats->count(Fault::ReapPersistent), 0u) << stats->describe();
  EXPECT_GT(failed, 0u);
}

// A file system that splits direct I/O at more than the block size (XFS with largeio reports an
// st_blksize of 4 MiB, four times the block size here): a read of several 4 MiB pieces lands
// shifted, needing no bounce chunk; a read of one middle piece, and a write, bounce in pieces of
// one chunk (1 MiB) instead of 4 MiB; device memory, whose edges (up to 4 MiB) bounce too, goes
// through the page cache (refused with direct=on). Every mode stays direct for host memory.
TEST_P(ShiftedReads, StayDirectWhereTheFileSystemSplitsAboveABounceChunk) {
  std::string why;
  auto fs = LoopMount::make("/dev/shm", 320 * MiB, &why, LoopFs::XfsLargeIo);
  if (!fs) GTEST_SKIP() << "no XFS loop mount with largeio (xfsprogs, root): " << why;
  const std::string path = fs->file("split.bin");
  constexpr std::size_t kLen = 16 * MiB;
  write_pattern_file(path, kLen + 2 * kOddOffset, 57);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(static_cast<std::uint64_t>(st.st_blksize), 4 * MiB) << "largeio's st_blksize";
  GuardedBuffer outer(kLen + 3 * 4096, BufKind::Aligned);
  for (const nvio::DirectIo direct : {nvio::DirectIo::Auto, nvio::DirectIo::On}) {
    Options o = base_options();
    o.block_size = MiB;
    o.direct = direct;
    // The file was just written through the page cache: cached reads would take it from there.
    o.cached_reads = nvio::CachedReads::Off;
    Handle h(o);
    const std::string mode = nvio::to_string(direct);
    // A page-aligned buffer at an odd offset, and a buffer one byte past a page at offset 0.
    for (const auto& [misalign, off] : {std::pair<std::size_t, std::uint64_t>{0, kOddOffset},
                                        std::pair<std::size_t, std::uint64_t>{1, 0}}) {
      SCOPED_TRACE(fmt::format("direct {}, buffer at page + {}, read of {} bytes at {}", mode,
                               misalign, kLen, off));
      const nvio::HandleStats before = h.stats();
      EXPECT_TRUE(read_inside(h, outer, misalign, path, off, kLen, 57));
      const nvio::HandleStats d = h.stats() - before;
      EXPECT_GT(d.shifted_bytes, 0u) << "the read did not land shifted";
      EXPECT_EQ(d.bounced_bytes, 0u);
    }
    {
      // 9 MiB at the odd offset: head [4103, 4 MiB), one middle piece [4 MiB, 8 MiB), tail.
      constexpr std::size_t kOne = 9 * MiB;
      SCOPED_TRACE(fmt::format("direct {}, read of {} bytes at {}", mode, kOne, kOddOffset));
      const nvio::HandleStats before = h.stats();
      EXPECT_TRUE(read_inside(h, outer, 0, path, kOddOffset, kOne, 57));
      const nvio::HandleStats d = h.stats() - before;
      EXPECT_EQ(d.bounced_bytes, 4 * MiB);
      EXPECT_EQ(d.edge_bytes, kOne - 4 * MiB);
      EXPECT_EQ(d.pieces, 2u + 4u) << "head, tail and four 1 MiB pieces";
    }
    {
      const std::string out = fs->file("written-" + mode + ".bin");
      SCOPED_TRACE(fmt::format("direct {}, write of {} bytes at {}", mode, kLen, kOddOffset));
      GuardedBuffer src(kLen, BufKind::Aligned);
      src.fill_pattern(kOddOffset, 58);
      const nvio::HandleStats before = h.stats();
      ASSERT_NO_THROW(h.write(src.data(), kLen, out, kOddOffset));
      const nvio::HandleStats d = h.stats() - before;
      const std::uint64_t middle = 16 * MiB - 4 * MiB;  // [4 MiB, 16 MiB): up to the tail's start
      EXPECT_EQ(d.bounced_bytes, middle);
      EXPECT_EQ(d.edge_bytes, kLen - middle);
      const auto file = read_file(out);
      ASSERT_EQ(file.size(), kOddOffset + kLen);
      EXPECT_TRUE(file_range_has_pattern(file, kOddOffset, kLen, 58));
    }
    {
      ScopedFakeDevice fake(1, 5);
      constexpr std::size_t kDev = 2 * MiB;
      unsigned char* dev = fake->alloc(kDev);
      nvio::ReadOptions ro;
      ro.memory = nvio::MemoryKind::Device;
      SCOPED_TRACE(fmt::format("direct {}, device read of {} bytes at {}", mode, kDev, kOddOffset));
      if (direct == nvio::DirectIo::On) {
        EXPECT_THROW(h.read(dev, kDev, path, kOddOffset, ro), nvio::InvalidArgument);
      } else {
        const nvio::HandleStats before = h.stats();
        ASSERT_NO_THROW(h.read(dev, kDev, path, kOddOffset, ro));
        EXPECT_TRUE(buffer_has_pattern(dev, kDev, kOddOffset, 57));
        const nvio::HandleStats d = h.stats() - before;
        EXPECT_EQ(d.edge_bytes, 0u) << "no direct edges: the page cache";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, BouncedPieces, NVIO_ALL_ENGINES, EngineParamName());
INSTANTIATE_TEST_SUITE_P(Engines, ShiftedReads, NVIO_ALL_ENGINES, EngineParamName());
INSTANTIATE_TEST_SUITE_P(Psync, BounceOrder, ::testing::Values(EngineKind::Psync),
                         EngineParamName());

// ---- io_uring: the bounce slabs as registered buffers --------------------------------------

class RegisteredBuffers : public BouncedPieces {
 protected:
  void SetUp() override {
    BouncedPieces::SetUp();
    ring_spy().reset();
  }
  // Options of an io_uring handle (whose engines count through the calls above): two workers.
  Options counted_options() const {
    Options o = base_options();
    o.block_size = kBlock;
    o.queue_depth = 8;
    o.intra_op_parallelism = 2;
    return o;
  }
  // Writes MiB + 123 bytes at the odd offset (16 bounced pieces) and reads them back (landing
  // shifted: nothing bounced), then reads one piece's worth again (one bounced piece: a read of
  // one piece does not land shifted), byte-compared.
  void roundtrip_bounced(Handle& h, std::uint64_t seed) {
    const std::size_t len = MiB + 123;
    const std::string path = file("fixed.bin");
    GuardedBuffer buf(len, BufKind::Aligned);
    buf.fill_pattern(kOddOffset, seed);
    ASSERT_NO_THROW(h.write(buf.data(), len, path, kOddOffset));
    EXPECT_TRUE(file_range_has_pattern(read_file(path), kOddOffset, len, seed));
    buf.fill_sentinel();
    ASSERT_NO_THROW(h.read(buf.data(), len, path, kOddOffset));
    EXPECT_TRUE(buffer_has_pattern(buf.data(), len, kOddOffset, seed));
    buf.fill_sentinel();
    const std::size_t one = (8192 - kOddOffset) + kBlock + 5;  // head, one piece, tail
    ASSERT_NO_THROW(h.read(buf.data(), one, path, kOddOffset));
    EXPECT_TRUE(buffer_has_pattern(buf.data(), one, kOddOffset, seed));
    EXPECT_TRUE(buf.guards_intact());
  }

  ScopedEngineFactory factory_{[](EngineKind k, unsigned qd) -> std::unique_ptr<Engine> {
    if (k != EngineKind::IoUring) return nvio::engine::make_backend_engine(k, qd);
    return nvio::engine::make_io_uring_engine(qd, spying_io_uring_calls());
  }};
};

// Bounced pieces go out as READ_FIXED / WRITE_FIXED on the registered slabs; a zero-copy
// transfer of the caller's own aligned memory uses none.
TEST_P(RegisteredBuffers, BouncedPiecesUseFixedOps) {
  Handle h(counted_options());
  roundtrip_bounced(h, 61);
  EXPECT_GT(ring_spy().sparse.load(), 0);
  if (ring_spy().registered.load() == 0) {
    GTEST_SKIP() << "this kernel registered no bounce slab (RLIMIT_MEMLOCK?)";
  }
  // 16 bounced pieces written and 1 read, each one request (no short transfers here).
  EXPECT_EQ(ring_spy().fixed.load(), 17);

  const int fixed = ring_spy().fixed.load();
  GuardedBuffer aligned(4 * MiB, BufKind::Aligned);
  aligned.fill_pattern(0, 62);
  ASSERT_NO_THROW(h.write(aligned.data(), aligned.size(), file("zero-copy.bin"), 0));
  aligned.fill_sentinel();
  ASSERT_NO_THROW(h.read(aligned.data(), aligned.size(), file("zero-copy.bin"), 0));
  EXPECT_TRUE(buffer_has_pattern(aligned.data(), aligned.size(), 0, 62));
  EXPECT_EQ(ring_spy().fixed.load(), fixed) << "zero-copy pieces used fixed ops";
}

// A kernel that refuses the table, or each slab, leaves the pieces on plain reads and writes,
// with the same bytes and no error.
TEST_P(RegisteredBuffers, RefusedRegistrationFallsBackToPlainOps) {
  for (const int refuse : {1, 2}) {
    SCOPED_TRACE(refuse == 1 ? "table refused" : "slabs refused");
    ring_spy().reset();
    // As under RLIMIT_MEMLOCK.
    (refuse == 1 ? ring_spy().refuse_sparse : ring_spy().refuse_update) = -ENOMEM;
    Handle h(counted_options());
    roundtrip_bounced(h, 70 + static_cast<std::uint64_t>(refuse));
    EXPECT_GT(ring_spy().sparse.load(), 0) << "the refusal was never injected";
    if (refuse == 2) {
      EXPECT_GT(ring_spy().updates.load(), 0) << "the refusal was never injected";
    } else {
      EXPECT_EQ(ring_spy().updates.load(), 0) << "slabs offered to a table the kernel refused";
    }
    EXPECT_EQ(ring_spy().fixed.load(), 0);
    EXPECT_GE(ring_spy().plain.load(), 32);
  }
}

INSTANTIATE_TEST_SUITE_P(IoUring, RegisteredBuffers, ::testing::Values(EngineKind::IoUring),
                         EngineParamName());

}  // namespace
}  // namespace nvio_test
