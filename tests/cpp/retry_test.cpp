// The retry policy for EINTR and EAGAIN (core/retry.hpp): engines report them as completions and
// never loop; the handle retries a piece a bounded number of times, then fails with the errno.
// The psync engine's system calls are replaced (engine/engine.hpp's PsyncCalls) to inject them,
// and to truncate a file while it is being read.
#include "core/retry.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;
using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::PsyncCalls;
using nvio::engine::Request;

// What the fake system calls do, shared by all threads. `g_failures` transfers fail with `g_errno`
// before they pass to the real call (-1: all of them).
std::atomic<int> g_calls{0};
std::atomic<int> g_failures{0};
std::atomic<int> g_errno{EINTR};

void inject(int failures, int err) {
  g_calls = 0;
  g_failures = failures;
  g_errno = err;
}

bool take_failure() {
  ++g_calls;
  int left = g_failures.load();
  while (left != 0) {
    if (left < 0) return true;
    if (g_failures.compare_exchange_weak(left, left - 1)) return true;
  }
  return false;
}

ssize_t flaky_pread(int fd, void* buf, std::size_t n, off_t off) {
  if (take_failure()) {
    errno = g_errno;
    return -1;
  }
  return ::pread(fd, buf, n, off);
}

ssize_t flaky_pwrite(int fd, const void* buf, std::size_t n, off_t off) {
  if (take_failure()) {
    errno = g_errno;
    return -1;
  }
  return ::pwrite(fd, buf, n, off);
}

constexpr PsyncCalls kFlaky{flaky_pread, flaky_pwrite};

// Every handle made while it lives uses psync engines with the flaky system calls.
class FlakyEngines {
 public:
  FlakyEngines()
      : guard_([](nvio::EngineKind, unsigned qd) {
          return nvio::engine::make_psync_engine(qd, kFlaky);
        }) {}

 private:
  ScopedEngineFactory guard_;
};

class EngineRetry : public ::testing::TestWithParam<int> {};

// An engine reports EINTR / EAGAIN once, as the completion, instead of repeating the call.
TEST_P(EngineRetry, PsyncReportsTheErrnoAfterOneCall) {
  const int err = GetParam();
  TempDir dir;
  const std::string path = dir.file("f.bin");
  write_pattern_file(path, 8192, 1);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<unsigned char> buf(4096);
  for (Direction d : {Direction::Read, Direction::Write}) {
    inject(-1, err);
    auto engine = nvio::engine::make_psync_engine(4, kFlaky);
    Completion c{};
    int reaped = 0;
    run_within(10s, "psync submit with a call that always fails", [&] {
      const Request r{fd, d, buf.data(), buf.size(), 4096, 7};
      ASSERT_EQ(engine->submit({&r, 1}), 1);
      reaped = engine->reap({&c, 1}, 1);
    });
    ASSERT_EQ(reaped, 1);
    EXPECT_EQ(c.tag, 7u);
    EXPECT_EQ(c.result, -err);
    EXPECT_EQ(g_calls.load(), 1) << "the engine must not repeat the call itself";
  }
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Errnos, EngineRetry, ::testing::Values(EINTR, EAGAIN),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == EINTR ? "EINTR" : "EAGAIN");
                         });

class HandleRetry : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { direct_ = nvio::probe_directory(dir_.path()); }
  nvio::Options options() const {
    nvio::Options o;
    o.engine = nvio::EngineKind::Psync;
    o.direct = direct_.supported ? nvio::DirectIo::On : nvio::DirectIo::Off;
    o.block_size = 64 * KiB;
    o.queue_depth = 4;
    o.intra_op_parallelism = 2;
    return o;
  }

  TempDir dir_;
  nvio::DirectIoInfo direct_;
};

// A transfer that always fails with EINTR / EAGAIN fails the operation with that errno, naming
// the path and the piece, within a bounded time; reads and writes, blocking and asynchronous.
TEST_P(HandleRetry, EndlessFailureIsReported) {
  const int err = GetParam();
  const std::string path = dir_.file("f.bin");
  constexpr std::uint64_t kOffset = 4096 + 17;
  constexpr std::size_t kLength = 300 * KiB + 5;
  write_pattern_file(path, kOffset + kLength, 2);
  FlakyEngines flaky;
  nvio::Handle h(options());
  GuardedBuffer buf(kLength, BufKind::Plus1);
  buf.fill_pattern(kOffset, 2);
  auto check = [&](const char* what, auto&& call) {
    SCOPED_TRACE(what);
    inject(-1, err);
    run_within(20s, what, [&] {
      try {
        call();
        ADD_FAILURE() << "no exception";
      } catch (const nvio::IoError& e) {
        EXPECT_EQ(e.error_code(), err) << e.what();
        EXPECT_EQ(e.path(), path);
        EXPECT_TRUE(contains(e.what(), path));
        EXPECT_GE(e.offset(), kOffset);
        EXPECT_LE(e.offset() + e.length(), kOffset + kLength);
        EXPECT_GT(e.length(), 0u);
        EXPECT_TRUE(contains(e.what(), "offset " + std::to_string(e.offset())));
        EXPECT_TRUE(contains(e.what(), "length " + std::to_string(e.length())));
      }
    });
    // Each piece is tried once and retried kTransferRetries times, no more.
    EXPECT_GE(g_calls.load(), static_cast<int>(nvio::detail::kTransferRetries) + 1);
    EXPECT_LE(g_calls.load(), 20 * static_cast<int>(nvio::detail::kTransferRetries + 1));
  };
  check("read", [&] { h.read(buf.data(), kLength, path, kOffset); });
  check("write", [&] { h.write(buf.data(), kLength, path, kOffset); });
  check("async read", [&] { h.wait(h.submit_read(buf.data(), kLength, path, kOffset)); });
  check("async write", [&] { h.wait(h.submit_write(buf.data(), kLength, path, kOffset)); });
  EXPECT_TRUE(buf.guards_intact());
  // One piece alone: the error names exactly that piece.
  const std::size_t small = 1000;
  inject(-1, err);
  try {
    h.read(buf.data(), small, path, kOffset);
    ADD_FAILURE() << "no exception";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), err);
    EXPECT_EQ(e.offset(), kOffset);
    EXPECT_EQ(e.length(), small);
  }
  EXPECT_EQ(g_calls.load(), static_cast<int>(nvio::detail::kTransferRetries) + 1);
}

// Failures fewer than the retry bound are invisible: the bytes are right, both ways.
TEST_P(HandleRetry, SomeFailuresThenSuccess) {
  const int err = GetParam();
  const std::string path = dir_.file("f.bin");
  constexpr std::uint64_t kOffset = 4096 + 17;
  constexpr std::size_t kLength = 300 * KiB + 5;
  FlakyEngines flaky;
  nvio::Handle h(options());
  for (BufKind kind : {BufKind::Aligned, BufKind::Plus3}) {
    SCOPED_TRACE(to_string(kind));
    ::unlink(path.c_str());
    GuardedBuffer wb(kLength, kind);
    wb.fill_pattern(kOffset, 3);
    inject(static_cast<int>(nvio::detail::kTransferRetries) - 1, err);
    run_within(20s, "write", [&] { h.write(wb.data(), kLength, path, kOffset); });
    EXPECT_EQ(g_failures.load(), 0) << "the failures were injected";
    const auto file = read_file(path);
    ASSERT_EQ(file.size(), kOffset + kLength);
    EXPECT_TRUE(file_range_has_pattern(file, kOffset, kLength, 3));

    GuardedBuffer rb(kLength, kind);
    rb.fill_sentinel();
    inject(static_cast<int>(nvio::detail::kTransferRetries) - 1, err);
    run_within(20s, "read", [&] { h.read(rb.data(), kLength, path, kOffset); });
    EXPECT_EQ(g_failures.load(), 0);
    EXPECT_TRUE(buffer_has_pattern(rb.data(), kLength, kOffset, 3));
    EXPECT_TRUE(rb.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Errnos, HandleRetry, ::testing::Values(EINTR, EAGAIN),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == EINTR ? "EINTR" : "EAGAIN");
                         });

// A read that meets end of file inside the request (another process truncates the file while it
// is read) is a ShortFile that says where the file ended and how long it is now.
std::string g_shrink_path;
std::atomic<bool> g_shrunk{false};
constexpr off_t kShrinkTo = 100 * 1024;

ssize_t shrinking_pread(int fd, void* buf, std::size_t n, off_t off) {
  if (!g_shrunk.exchange(true)) {
    EXPECT_EQ(::truncate(g_shrink_path.c_str(), kShrinkTo), 0);
  }
  return ::pread(fd, buf, n, off);
}

TEST(ShortRead, FileTruncatedDuringRead) {
  TempDir dir;
  g_shrink_path = dir.file("f.bin");
  constexpr std::size_t kLength = 8 * MiB;
  nvio::Options o;
  o.engine = nvio::EngineKind::Psync;
  o.direct = nvio::DirectIo::Off;
  o.block_size = 256 * KiB;
  o.queue_depth = 1;
  o.intra_op_parallelism = 1;
  ScopedEngineFactory guard([](nvio::EngineKind, unsigned qd) {
    return nvio::engine::make_psync_engine(qd, PsyncCalls{shrinking_pread, ::pwrite});
  });
  nvio::Handle h(o);
  std::vector<unsigned char> buf(kLength);
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    write_pattern_file(g_shrink_path, kLength, 4);
    g_shrunk = false;
    try {
      if (async) {
        h.wait(h.submit_read(buf.data(), kLength, g_shrink_path, 0));
      } else {
        h.read(buf.data(), kLength, g_shrink_path, 0);
      }
      ADD_FAILURE() << "no exception";
    } catch (const nvio::ShortFile& e) {
      EXPECT_EQ(e.file_size(), static_cast<std::uint64_t>(kShrinkTo));
      EXPECT_EQ(e.offset(), 0u);
      EXPECT_EQ(e.length(), kLength);
      EXPECT_TRUE(contains(e.what(), g_shrink_path));
      EXPECT_TRUE(contains(e.what(), "ended at byte " + std::to_string(kShrinkTo))) << e.what();
      EXPECT_TRUE(contains(e.what(), "size is now " + std::to_string(kShrinkTo))) << e.what();
      EXPECT_FALSE(contains(e.what(), "holds only")) << e.what();
    }
  }
}

TEST(RetryCounter, BoundedAndResetByProgress) {
  nvio::detail::RetryCounter c(3);
  EXPECT_FALSE(c.retry(EIO)) << "only EINTR and EAGAIN are retried";
  EXPECT_TRUE(c.retry(EINTR));
  EXPECT_TRUE(c.retry(EAGAIN));
  EXPECT_TRUE(c.retry(EINTR));
  EXPECT_FALSE(c.retry(EINTR));
  c.progress();
  EXPECT_TRUE(c.retry(EINTR));
  int calls = 0;
  EXPECT_EQ(nvio::detail::retry_interrupted([&] { return ++calls < 5 ? -EINTR : 42; }), 42);
  EXPECT_EQ(calls, 5);
  calls = 0;
  EXPECT_EQ(nvio::detail::retry_interrupted([&] {
              ++calls;
              return -EINTR;
            }),
            -EINTR);
  EXPECT_EQ(calls, static_cast<int>(nvio::detail::kInterruptedCallRetries) + 1);
  calls = 0;
  EXPECT_EQ(nvio::detail::retry_interrupted([&] { return ++calls, -EAGAIN; }), -EAGAIN)
      << "EAGAIN from a call that moves nothing is the caller's to handle";
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace nvio_test
