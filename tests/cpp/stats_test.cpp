// Handle::stats() against workloads whose counts are known in advance, per engine: how a request
// is cut (pieces, unaligned edges, bounced middles, device memory through the bounce path), what
// the operations add up to, and, through the fault engine, retries, short transfers and errors
// by errno. The expected cut is computed here from the rule in include/nvio/handle.hpp and
// handle/plan.hpp (edges split at the largest of the direct-I/O offset alignment, the page size
// and st_blksize), not by calling the planner.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <ostream>
#include <vector>

#include "engine_override.hpp"
#include "fake_device.hpp"
#include "fault_engine.hpp"
#include "nvio/handle.hpp"
#include "test_util.hpp"

namespace nvio {
// For gtest's messages: every counter by name, then the errors.
void PrintTo(const HandleStats& s, std::ostream* os) {
  for (const HandleStatsField& f : handle_stats_fields())
    *os << f.name << "=" << s.*f.member << " ";
  *os << "errors={";
  for (const auto& [err, n] : s.errors) *os << err << ":" << n << " ";
  *os << "}";
}
}  // namespace nvio

namespace nvio_test {
namespace {

using nvio::Handle;
using nvio::HandleStats;

constexpr std::size_t kBlock = 256 * KiB;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

// How a direct-I/O request [off, off + len) is cut, with its middle's memory at `middle_addr`.
struct Cut {
  std::uint64_t head = 0;  // bytes of the buffered head
  std::uint64_t middle = 0;
  std::uint64_t tail = 0;
  std::uint64_t pieces = 0;
};

class Stats : public EngineTest {
 protected:
  // The split granularity for files in this test's directory.
  std::uint64_t split_align(const std::string& path) const {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return std::max<std::uint64_t>({direct_info().offset_align,
                                    static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)),
                                    static_cast<std::uint64_t>(st.st_blksize), 1});
  }
  Cut cut(const std::string& path, std::uint64_t off, std::uint64_t len) const {
    const std::uint64_t a = split_align(path);
    const std::uint64_t end = off + len;
    const std::uint64_t head_end = std::min(round_up(off, a), end);
    const std::uint64_t tail_begin = std::max(round_down(end, a), head_end);
    const std::uint64_t piece = std::max(a, round_down(kBlock, a));
    Cut c;
    c.head = head_end - off;
    c.middle = tail_begin - head_end;
    c.tail = end - tail_begin;
    c.pieces = (c.middle + piece - 1) / piece + (c.head > 0) + (c.tail > 0);
    return c;
  }
  nvio::Options options() const {
    nvio::Options o = base_options();
    o.block_size = kBlock;
    o.queue_depth = 4;
    o.intra_op_parallelism = 2;
    o.gpu_direct = nvio::GpuDirect::Off;
    return o;
  }
  // An empty file, so that split_align can stat it before nvio writes it.
  std::string empty_file(const std::string& name) const {
    const std::string path = file(name);
    write_file(path, "", 0);
    return path;
  }
};

// Every counter but those a test names is zero.
HandleStats only(
    std::initializer_list<std::pair<std::uint64_t HandleStats::*, std::uint64_t>> set) {
  HandleStats s;
  for (const auto& [member, value] : set) s.*member = value;
  return s;
}

TEST_P(Stats, FreshHandleCountsNothing) {
  Handle h(options());
  EXPECT_EQ(h.stats(), HandleStats{});
}

// A write at an unaligned offset of MiB + 123 bytes from a buffer whose middle is aligned: the
// edges go through the buffered descriptor, the middle straight from the buffer in block pieces;
// the read back from the same kind of buffer cuts the same way.
TEST_P(Stats, UnalignedRequestCountsEdgesAndPieces) {
  if (!direct_supported()) GTEST_SKIP() << "no O_DIRECT in " << dir() << ": no edges";
  const std::string path = empty_file("edges.bin");
  const std::uint64_t off = 4096 + 17;
  const std::size_t len = MiB + 123;
  const Cut c = cut(path, off, len);
  ASSERT_GT(c.head, 0u);
  ASSERT_GT(c.tail, 0u);
  // The buffer starts as far past an aligned address as `off` is past an aligned offset, so the
  // middle's memory is aligned too: nothing bounces.
  nvio::AlignedBuffer mem(len + 2 * split_align(path));
  unsigned char* buf = static_cast<unsigned char*>(mem.data()) + off % split_align(path);
  nvio::pattern::fill(buf, len, off, 3);
  Handle h(options());
  h.write(buf, len, path, off);
  const HandleStats w = h.stats();
  EXPECT_EQ(w, only({{&HandleStats::writes, 1},
                     {&HandleStats::bytes_written, len},
                     {&HandleStats::pieces, c.pieces},
                     {&HandleStats::edge_bytes, c.head + c.tail}}));
  EXPECT_TRUE(file_range_has_pattern(read_file(path), off, len, 3));

  std::fill(buf, buf + len, kSentinel);
  h.read(buf, len, path, off);
  EXPECT_TRUE(buffer_has_pattern(buf, len, off, 3));
  EXPECT_EQ(h.stats() - w, only({{&HandleStats::reads, 1},
                                 {&HandleStats::bytes_read, len},
                                 {&HandleStats::pieces, c.pieces},
                                 {&HandleStats::edge_bytes, c.head + c.tail}}));
}

// An aligned request from memory not aligned for O_DIRECT. A write bounces every byte, in block
// pieces, with no edges; so does a read of one piece. A read of several pieces lands shifted in
// the caller's buffer instead (ShiftedRead): its middle and its tail (aligned, so direct too) are
// shifted bytes, one piece more than the block pieces, nothing bounced, no edges.
TEST_P(Stats, UnalignedBufferCountsBouncedAndShiftedBytes) {
  if (!direct_supported()) GTEST_SKIP() << "no O_DIRECT in " << dir() << ": nothing bounces";
  if (direct_info().mem_align <= 1) GTEST_SKIP() << "any address suits O_DIRECT here";
  const std::string path = file("bounce.bin");
  const std::size_t len = MiB;
  GuardedBuffer buf(len, BufKind::Plus1);
  buf.fill_pattern(0, 4);
  Handle h(options());
  h.write(buf.data(), len, path, 0);
  EXPECT_TRUE(file_range_has_pattern(read_file(path), 0, len, 4));
  const std::uint64_t block = std::max<std::uint64_t>(split_align(path), kBlock);
  ASSERT_GE(len / block, 3u) << "the read must have several pieces";
  EXPECT_EQ(h.stats(), only({{&HandleStats::writes, 1},
                             {&HandleStats::bytes_written, len},
                             {&HandleStats::pieces, len / block},
                             {&HandleStats::bounced_bytes, len}}));

  HandleStats before = h.stats();
  buf.fill_sentinel();
  h.read(buf.data(), block, path, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), block, 0, 4));
  EXPECT_EQ(h.stats() - before, only({{&HandleStats::reads, 1},
                                      {&HandleStats::bytes_read, block},
                                      {&HandleStats::pieces, 1},
                                      {&HandleStats::bounced_bytes, block}}));

  // The buffer is one byte past a page: its pieces land 4095 bytes on (a page-aligned address),
  // so the middle ends at the split alignment at or before len - 4095; the tail is the rest.
  ASSERT_LE(direct_info().mem_align, 4096u);
  const std::uint64_t tail_begin = (len - 4095) / split_align(path) * split_align(path);
  before = h.stats();
  buf.fill_sentinel();
  h.read(buf.data(), len, path, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), len, 0, 4));
  EXPECT_TRUE(buf.guards_intact());
  EXPECT_EQ(h.stats() - before, only({{&HandleStats::reads, 1},
                                      {&HandleStats::bytes_read, len},
                                      {&HandleStats::pieces, (tail_begin + block - 1) / block + 1},
                                      {&HandleStats::shifted_bytes, len}}));
}

// Without direct I/O a request is plain block pieces: no edges, nothing bounced, whatever the
// offset and the buffer.
TEST_P(Stats, BufferedRequestIsBlockPieces) {
  const std::string path = file("buffered.bin");
  const std::uint64_t off = 3;
  const std::size_t len = 3 * kBlock + 5;
  GuardedBuffer buf(len, BufKind::Plus3);
  buf.fill_pattern(off, 5);
  nvio::Options o = options();
  o.direct = nvio::DirectIo::Off;
  Handle h(o);
  h.write(buf.data(), len, path, off);
  h.read(buf.data(), len, path, off);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), len, off, 5));
  EXPECT_EQ(h.stats(), only({{&HandleStats::reads, 1},
                             {&HandleStats::writes, 1},
                             {&HandleStats::bytes_read, len},
                             {&HandleStats::bytes_written, len},
                             {&HandleStats::pieces, 2 * 4}}));
}

// Asynchronous operations and batches count like blocking ones, each extent as an operation; a
// zero-length write counts as an operation of no bytes and no pieces.
TEST_P(Stats, AsyncBatchAndEmptyOperationsCount) {
  const std::string path = file("batch.bin");
  write_pattern_file(path, 4 * MiB, 6);
  // Aligned memory: whole pieces, nothing landing shifted (which adds a tail piece).
  GuardedBuffer a(MiB, BufKind::Aligned), b(2 * MiB, BufKind::Aligned), c(4096, BufKind::Aligned);
  const nvio::ReadExtent extents[] = {{a.data(), a.size(), 0, path},
                                      {b.data(), b.size(), MiB, path},
                                      {c.data(), c.size(), 3 * MiB, path}};
  Handle h(options());
  h.wait(h.submit_read_batch(extents));
  h.wait(h.submit_read(a.data(), a.size(), path, 0));
  h.write(a.data(), 0, file("empty.bin"), 0);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.reads, 4u);
  EXPECT_EQ(s.bytes_read, 2 * MiB + 2 * MiB + 4096);
  EXPECT_EQ(s.writes, 1u);
  EXPECT_EQ(s.bytes_written, 0u);
  // Whole blocks from aligned offsets: one piece each, buffered or direct.
  EXPECT_EQ(s.pieces, (MiB + 2 * MiB + MiB) / kBlock + 1);
  EXPECT_TRUE(s.errors.empty());
  EXPECT_TRUE(buffer_has_pattern(b.data(), b.size(), MiB, 6));
}

// Device memory on the bounce path (a fake device: host memory that CUDA would call device
// memory): every byte through host bounce chunks, none through cuFile, edges as for host memory.
TEST_P(Stats, DeviceMemoryCountsBounceBytes) {
  ScopedFakeDevice fake(1, 3);
  const std::string path = empty_file("device.bin");
  const std::uint64_t off = 4096 + 17;
  const std::size_t len = MiB + 123;
  unsigned char* dev = fake->alloc(len);
  nvio::pattern::fill(dev, len, off, 8);
  Handle h(options());
  h.write(dev, len, path, off, {.memory = nvio::MemoryKind::Device});
  const HandleStats s = h.stats();
  EXPECT_EQ(s.writes, 1u);
  EXPECT_EQ(s.bytes_written, len);
  EXPECT_EQ(s.device_bounce_bytes, len);
  EXPECT_EQ(s.gds_bytes, 0u);
  EXPECT_EQ(s.bounced_bytes, 0u) << "host-memory bounces only";
  if (direct_supported()) {
    const Cut c = cut(path, off, len);
    EXPECT_EQ(s.edge_bytes, c.head + c.tail);
    EXPECT_EQ(s.pieces, c.pieces);
  } else {
    EXPECT_EQ(s.edge_bytes, 0u);
    EXPECT_EQ(s.pieces, (len + kBlock - 1) / kBlock);
  }
  EXPECT_TRUE(file_range_has_pattern(read_file(path), off, len, 8));
}

// `count` operations of 300 KiB at varied offsets, reads and writes by turns, each checked when it
// succeeds; returns how many failed with each errno.
std::map<int, std::uint64_t> run_faulty(Handle& h, const std::string& dir, std::size_t count) {
  const std::string src = dir + "/src.bin";
  write_pattern_file(src, 2 * MiB, 11);
  std::map<int, std::uint64_t> failures;
  GuardedBuffer buf(300 * KiB, BufKind::Aligned);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t off = (i * 77 * KiB) % MiB;
    try {
      if (i % 2 == 0) {
        h.read(buf.data(), buf.size(), src, off);
        EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), off, 11));
      } else {
        buf.fill_pattern(off, 12);
        h.write(buf.data(), buf.size(), dir + "/w" + std::to_string(i), off);
      }
    } catch (const nvio::IoError& e) {
      ++failures[e.error_code()];
    }
  }
  return failures;
}

// EINTR and EAGAIN completions: each is one retry, and every operation succeeds.
TEST_P(Stats, TransientCompletionsAreRetries) {
  FaultPlan plan;
  plan.interrupted = 0.15;
  plan.would_block = 0.15;
  auto injected = std::make_shared<FaultStats>();
  ScopedEngineFactory factory(fault_engine_factory(plan, 41, injected));
  Handle h(options());
  EXPECT_TRUE(run_faulty(h, dir(), 24).empty());
  const HandleStats s = h.stats();
  const std::uint64_t transient =
      injected->count(Fault::Interrupted) + injected->count(Fault::WouldBlock);
  EXPECT_GT(transient, 0u) << injected->describe();
  EXPECT_EQ(s.retries, transient) << injected->describe();
  EXPECT_EQ(s.short_transfers, 0u);
  EXPECT_EQ(s.reads + s.writes, 24u);
  EXPECT_EQ(s.bytes_read + s.bytes_written, 24 * 300 * KiB);
  EXPECT_TRUE(s.errors.empty());
}

// Short transfers: each is counted and resumed, and every operation succeeds.
TEST_P(Stats, ShortTransfersAreCountedAndResumed) {
  FaultPlan plan;
  plan.short_transfer = 0.3;
  auto injected = std::make_shared<FaultStats>();
  ScopedEngineFactory factory(fault_engine_factory(plan, 42, injected));
  Handle h(options());
  EXPECT_TRUE(run_faulty(h, dir(), 24).empty());
  const HandleStats s = h.stats();
  EXPECT_GT(injected->count(Fault::ShortTransfer), 0u) << injected->describe();
  EXPECT_EQ(s.short_transfers, injected->count(Fault::ShortTransfer)) << injected->describe();
  EXPECT_EQ(s.retries, 0u);
  EXPECT_EQ(s.reads + s.writes, 24u);
  EXPECT_TRUE(s.errors.empty());
}

// Error completions: every operation fails, and `errors` holds each failure under the errno its
// IoError carried (EIO, EBADF, ENOSPC, EROFS as the fault engine drew them).
TEST_P(Stats, FailuresAreCountedByErrno) {
  FaultPlan plan;
  plan.request_error = 1;
  auto injected = std::make_shared<FaultStats>();
  ScopedEngineFactory factory(fault_engine_factory(plan, 43, injected));
  Handle h(options());
  const std::map<int, std::uint64_t> failures = run_faulty(h, dir(), 16);
  std::uint64_t failed = 0;
  for (const auto& [err, n] : failures) failed += n;
  EXPECT_EQ(failed, 16u);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.errors, failures);
  EXPECT_EQ(s.reads + s.writes, 0u);
  EXPECT_EQ(s.bytes_read + s.bytes_written, 0u);
}

// issue 28 #11: calls refused before anything was submitted counted nowhere. Each counts once in
// `errors` under its errno (0 where the error has none), a refused batch once.
TEST_P(Stats, RefusedCallsAreCountedAsFailures) {
  Handle h(options());
  std::vector<std::byte> buf(8192);
  const std::string small = file("small");
  write_file(small, "four", 4);
  EXPECT_THROW(h.read(buf.data(), buf.size(), file("missing"), 0), nvio::IoError);
  EXPECT_THROW(h.read(buf.data(), buf.size(), small, 0), nvio::ShortFile);
  EXPECT_THROW(h.submit_read(buf.data(), buf.size(), small, 0), nvio::ShortFile);
  EXPECT_THROW(h.read(nullptr, 1, small, 0), nvio::InvalidArgument);
  std::vector<nvio::ReadExtent> extents(2);
  for (auto& e : extents) {
    e.buf = buf.data();
    e.length = 4;
    e.file = small;
  }
  extents[1].file = file("missing");
  EXPECT_THROW(h.read_batch(extents), nvio::IoError);
  const HandleStats s = h.stats();
  const std::map<int, std::uint64_t> want{{0, 3}, {ENOENT, 2}};
  EXPECT_EQ(s.errors, want);
  EXPECT_EQ(s.reads + s.writes, 0u);
}

// A forked child's handle state is fresh: its counters start at zero and count its own
// operations; the parent's are unchanged.
TEST_P(Stats, ForkedChildStartsAtZero) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  const std::string path = file("fork.bin");
  write_pattern_file(path, MiB, 13);
  Handle h(options());
  std::vector<unsigned char> buf(MiB);
  h.read(buf.data(), buf.size(), path, 0);
  const HandleStats parent = h.stats();
  ASSERT_EQ(parent.reads, 1u);
  const int status = run_in_child([&] {
    if (h.stats() != HandleStats{}) return 1;
    h.read(buf.data(), 4096, path, 0);
    const HandleStats mine = h.stats();
    return mine.reads == 1 && mine.bytes_read == 4096 ? 0 : 2;
  });
  EXPECT_EQ(status, 0) << "1: the child saw its parent's counters, 2: it miscounted, 98: threw";
  EXPECT_EQ(h.stats(), parent);
}

INSTANTIATE_TEST_SUITE_P(Engines, Stats, NVIO_ALL_ENGINES, EngineParamName());

// The difference of two snapshots drops the errnos that did not change.
TEST(HandleStatsDifference, SubtractsFieldByField) {
  HandleStats before;
  before.reads = 2;
  before.bytes_read = 100;
  before.errors = {{EIO, 1}, {ENOSPC, 2}};
  HandleStats after = before;
  after.reads = 5;
  after.bytes_read = 400;
  after.retries = 7;
  after.errors[EIO] = 4;
  HandleStats expected =
      only({{&HandleStats::reads, 3}, {&HandleStats::bytes_read, 300}, {&HandleStats::retries, 7}});
  expected.errors = {{EIO, 3}};
  EXPECT_EQ(after - before, expected);
}

// The field table names every counter once, in the order of the struct.
TEST(HandleStatsDifference, FieldTableCoversTheStruct) {
  const std::pair<const char*, std::uint64_t HandleStats::*> expected[] = {
      {"reads", &HandleStats::reads},
      {"writes", &HandleStats::writes},
      {"bytes_read", &HandleStats::bytes_read},
      {"bytes_written", &HandleStats::bytes_written},
      {"pieces", &HandleStats::pieces},
      {"retries", &HandleStats::retries},
      {"short_transfers", &HandleStats::short_transfers},
      {"bounced_bytes", &HandleStats::bounced_bytes},
      {"edge_bytes", &HandleStats::edge_bytes},
      {"gds_bytes", &HandleStats::gds_bytes},
      {"device_bounce_bytes", &HandleStats::device_bounce_bytes},
      {"shifted_bytes", &HandleStats::shifted_bytes},
      {"cached_bytes", &HandleStats::cached_bytes},
  };
  const auto fields = nvio::handle_stats_fields();
  ASSERT_EQ(fields.size(), std::size(expected));
  for (std::size_t i = 0; i < fields.size(); ++i) {
    EXPECT_EQ(std::string(fields[i].name), expected[i].first);
    EXPECT_TRUE(fields[i].member == expected[i].second) << fields[i].name;
    EXPECT_NE(std::string(fields[i].description), "") << fields[i].name;
  }
}

}  // namespace
}  // namespace nvio_test
