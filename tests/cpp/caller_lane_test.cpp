// The caller-driven path (handle/caller_lane.hpp): small blocking calls made while the workers are
// idle run on the calling thread, on an engine of the handle's kind made there. Bytes compared on
// every engine at odd sizes, unaligned offsets and buffers, through File and Handle; threads
// sharing a File; an interrupt during a caller-driven read; a read past the end (ShortFile); and
// the same stats as the worker path (NVIO_CALLER_DRIVEN=off).
#include "handle/caller_lane.hpp"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine_override.hpp"
#include "held_engine.hpp"
#include "nvio/errors.hpp"
#include "nvio/file.hpp"
#include "nvio/interrupt.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

// An engine factory over the back ends that records the threads engines were made on.
struct EngineThreads {
  std::mutex mutex;
  std::set<std::thread::id> made_on;
  std::size_t count = 0;
  bool made_here() {
    std::lock_guard lock(mutex);
    return made_on.count(std::this_thread::get_id()) > 0;
  }
  nvio::engine::EngineFactory factory() {
    return [this](nvio::EngineKind kind, unsigned depth) {
      {
        std::lock_guard lock(mutex);
        made_on.insert(std::this_thread::get_id());
        ++count;
      }
      return nvio::engine::make_backend_engine(kind, depth);
    };
  }
};

class CallerLaneTest : public EngineTest {};

// Reads and writes of up to the path's limit and just past it, at odd lengths and offsets into
// unaligned buffers: bytes as in the file, through File and by path.
TEST_P(CallerLaneTest, SmallCallsRunOnTheCallerWithTheFilesBytes) {
  EngineThreads threads;
  const ScopedEngineFactory guard(threads.factory());
  nvio::Handle h(base_options());
  const std::string path = file("f.bin");
  write_pattern_file(path, 1 * MiB + 5, 3);
  nvio::File f(h, path, "r");
  struct Case {
    std::size_t length;
    std::uint64_t offset;
  };
  const Case cases[] = {{4 * KiB, 0},      {4 * KiB, 8 * KiB}, {1, 3},
                        {4095, 4097},      {64 * KiB, 0},      {64 * KiB, 511},
                        {64 * KiB + 1, 0}, {7, 1 * MiB - 2}};
  for (BufKind kind : kAllBufKinds) {
    for (const Case& c : cases) {
      GuardedBuffer buf(c.length, kind);
      f.read(buf.data(), c.length, c.offset);
      ASSERT_TRUE(buffer_has_pattern(buf.data(), c.length, c.offset, 3))
          << to_string(kind) << " length " << c.length << " offset " << c.offset;
      buf.fill_sentinel();
      h.read(buf.data(), c.length, path, c.offset);
      ASSERT_TRUE(buffer_has_pattern(buf.data(), c.length, c.offset, 3))
          << "by path " << to_string(kind) << " length " << c.length << " offset " << c.offset;
      ASSERT_TRUE(buf.guards_intact());
    }
  }
  EXPECT_TRUE(threads.made_here()) << "no engine was made on the calling thread";

  // Writes through the lane, read back by the workers (asynchronous: never caller-driven).
  nvio::File w(h, file("w.bin"), "w+");
  std::vector<unsigned char> out(4 * KiB + 3);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 1);
  w.write(out.data(), out.size(), 4097);
  std::vector<unsigned char> back(out.size());
  h.wait(w.submit_read(back.data(), back.size(), 4097));
  EXPECT_EQ(back, out);
  EXPECT_EQ(w.size(), 4097 + out.size());
}

// With NVIO_CALLER_DRIVEN=off every call goes to the workers, and the counters of the same calls
// are the same on both paths.
TEST_P(CallerLaneTest, CountsAsTheWorkersDo) {
  const std::string path = file("s.bin");
  write_pattern_file(path, 256 * KiB, 5);
  auto run = [&](bool lanes) {
    EngineThreads threads;
    const ScopedEngineFactory guard(threads.factory());
    const ScopedEnv env("NVIO_CALLER_DRIVEN", lanes ? "on" : "off");
    nvio::Handle h(base_options());
    nvio::File f(h, path, "r");
    GuardedBuffer buf(8 * KiB, BufKind::Plus3);
    for (int i = 0; i < 20; ++i) {
      f.read(buf.data(), 4 * KiB, static_cast<std::uint64_t>(i) * 4 * KiB);
      f.read(buf.data(), 5000, static_cast<std::uint64_t>(i) * 4 * KiB + 1);
    }
    EXPECT_THROW(f.read(buf.data(), 8 * KiB, 252 * KiB), nvio::ShortFile);
    EXPECT_EQ(threads.made_here(), lanes);
    return h.stats();
  };
  const nvio::HandleStats on = run(true);
  const nvio::HandleStats off = run(false);
  EXPECT_EQ(on.reads, off.reads);
  EXPECT_EQ(on.bytes_read, off.bytes_read);
  EXPECT_EQ(on.pieces, off.pieces);
  EXPECT_EQ(on.errors, off.errors);
  EXPECT_EQ(on.bounced_bytes, off.bounced_bytes);
  EXPECT_EQ(on.edge_bytes, off.edge_bytes);
}

// Four threads reading one File at once: each its own lane (or the workers when a lane is busy or
// the queue is not idle), bytes always right.
TEST_P(CallerLaneTest, ThreadsSharingAFileReadTheirBytes) {
  nvio::Handle h(base_options());
  const std::string path = file("t.bin");
  write_pattern_file(path, 2 * MiB, 9);
  nvio::File f(h, path, "r");
  constexpr unsigned kThreads = 4;
  const int reads = kSanitizerBuild ? 100 : 400;
  std::atomic<int> bad{0};
  run_threads(kThreads, [&](unsigned t) {
    GuardedBuffer buf(9000, t % 2 == 0 ? BufKind::Aligned : BufKind::Plus1);
    for (int i = 0; i < reads; ++i) {
      const std::size_t len = 1 + (static_cast<std::size_t>(i) * 977 + t * 31) % 9000;
      const std::uint64_t off =
          (static_cast<std::uint64_t>(i) * 40961 + t * 4096) % (2 * MiB - len);
      f.read(buf.data(), len, off);
      if (!buffer_has_pattern(buf.data(), len, off, 9)) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(h.stats().errors.empty());
}

// More threads over time than there are lanes: an ended thread's lane goes to the next thread,
// and threads beyond the lanes use the workers; bytes right either way.
TEST_P(CallerLaneTest, EndedThreadsLeaveTheirLanesToOthers) {
  EngineThreads threads;
  const ScopedEngineFactory guard(threads.factory());
  nvio::Handle h(base_options());
  const std::string path = file("m.bin");
  write_pattern_file(path, 256 * KiB, 6);
  nvio::File f(h, path, "r");
  auto reads = [&](unsigned t) {
    GuardedBuffer buf(4 * KiB, BufKind::Plus1);
    for (unsigned i = 0; i < 20; ++i) {
      const std::uint64_t off = ((t * 20 + i) * 4 * KiB + t) % (252 * KiB);
      f.read(buf.data(), 4 * KiB, off);
      if (!buffer_has_pattern(buf.data(), 4 * KiB, off, 6)) throw std::runtime_error("bytes");
    }
  };
  // One after another: each ends before the next starts.
  for (unsigned t = 0; t < 3 * nvio::detail::CallerLanes::kMaxLanes; ++t) {
    run_threads(1, [&](unsigned) { reads(t); });
  }
  {
    std::lock_guard lock(threads.mutex);  // a lane (an engine) for each, past the 8 places
    EXPECT_GE(threads.count, 3 * nvio::detail::CallerLanes::kMaxLanes);
  }
  // More at once than there are lanes.
  run_threads(2 * nvio::detail::CallerLanes::kMaxLanes, reads);
  EXPECT_TRUE(h.stats().errors.empty());
}

// A check that says stop while the caller drives a read the engine holds: the read's piece has
// started, so the call waits for the kernel to give it back and reports its outcome, the bytes;
// it never returns while the engine may still write into the buffer.
TEST_P(CallerLaneTest, InterruptDuringADrivenReadWaitsForTheKernel) {
  struct HoldAll final : CompletionGate {
    bool holds(const nvio::engine::Request&) override { return true; }
  };
  auto gate = std::make_shared<HoldAll>();
  EngineThreads threads;
  const ScopedEngineFactory guard([&threads, gate](
                                      nvio::EngineKind kind,
                                      unsigned depth) -> std::unique_ptr<nvio::engine::Engine> {
    {
      std::lock_guard lock(threads.mutex);
      threads.made_on.insert(std::this_thread::get_id());
    }
    return std::make_unique<HeldCompletions>(nvio::engine::make_backend_engine(kind, depth), gate);
  });
  nvio::Handle h(base_options());
  const std::string path = file("i.bin");
  write_pattern_file(path, 64 * KiB, 4);
  nvio::File f(h, path, "r");
  struct Stop final : nvio::InterruptCheck {
    std::atomic<int> asked{0};
    bool interrupted() noexcept override {
      ++asked;
      return true;
    }
  } stop;
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    opened = true;
    gate->open();
  });
  GuardedBuffer buf(4 * KiB, BufKind::Aligned);
  bool interrupted = false;
  {
    const nvio::ScopedInterruptCheck scope(stop);
    try {
      f.read(buf.data(), 4 * KiB, 8 * KiB);
    } catch (const nvio::Interrupted&) {
      interrupted = true;
    }
  }
  EXPECT_TRUE(opened.load()) << "the call returned while the engine held its request";
  opener.join();
  EXPECT_FALSE(interrupted) << "a started piece's outcome is reported";
  EXPECT_TRUE(buffer_has_pattern(buf.data(), 4 * KiB, 8 * KiB, 4));
  EXPECT_TRUE(threads.made_here());
  EXPECT_GE(gate->held.load(), 1u);
}

// Past the end: ShortFile through the lane, with the path and the numbers, counted as failed.
TEST_P(CallerLaneTest, ReadPastTheEndIsShortFile) {
  nvio::Handle h(base_options());
  const std::string path = file("short.bin");
  write_pattern_file(path, 10000, 2);
  nvio::File f(h, path, "r");
  GuardedBuffer buf(4 * KiB, BufKind::Aligned);
  try {
    f.read(buf.data(), 4 * KiB, 8 * KiB);
    FAIL() << "no error";
  } catch (const nvio::ShortFile& e) {
    EXPECT_TRUE(contains(e.what(), path));
  }
  EXPECT_THROW(h.read(buf.data(), 4 * KiB, path, 8 * KiB), nvio::ShortFile);
  std::uint64_t errors = 0;
  for (const auto& [err, n] : h.stats().errors) errors += n;
  EXPECT_EQ(errors, 2u);
  // A file cut short under the File (which still knows 10000 bytes): the read is queued, and the
  // lane's engine meets the end.
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  try {
    f.read(buf.data(), 4 * KiB, 4 * KiB);
    FAIL() << "no error";
  } catch (const nvio::ShortFile& e) {
    EXPECT_TRUE(contains(e.what(), path));
  }
  errors = 0;
  for (const auto& [err, n] : h.stats().errors) errors += n;
  EXPECT_EQ(errors, 3u);
  // The lane is still usable after the errors.
  f.read(buf.data(), 4 * KiB, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), 4 * KiB, 0, 2));
}

// A file cut at an unaligned size under the File: a direct read stops short of an aligned point
// again and again, which is the file's end (ShortFile with its size now), not an I/O error; the
// same through the caller's lane (4 KiB) and the workers (256 KiB), read direct.
TEST_P(CallerLaneTest, AFileCutAtAnUnalignedSizeEndsDirectReadsWithShortFile) {
  if (!direct_supported()) GTEST_SKIP() << "no O_DIRECT on " << dir();
  nvio::Options options = base_options();
  options.direct = nvio::DirectIo::On;
  nvio::Handle h(options);
  const std::string path = file("cut.bin");
  write_pattern_file(path, 1 * MiB, 4);
  nvio::File f(h, path, "r");
  ASSERT_EQ(::truncate(path.c_str(), 4096 + 100), 0);
  for (const std::size_t length : {4 * KiB, 256 * KiB}) {
    SCOPED_TRACE(length);
    GuardedBuffer buf(length, BufKind::Aligned);
    try {
      f.read(buf.data(), length, 4 * KiB);
      FAIL() << "no error";
    } catch (const nvio::ShortFile& e) {
      EXPECT_TRUE(contains(e.what(), path)) << e.what();
      EXPECT_TRUE(contains(e.what(), "4196")) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, CallerLaneTest, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace
}  // namespace nvio_test
