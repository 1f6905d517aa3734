// Tests of single back ends at the engine level: what the Engine contract suite
// (engine_contract_test.cpp) cannot provoke through the kernel's ordinary behaviour.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "nvio/pattern.hpp"
#include "nvio/system.hpp"
#include "test_util.hpp"

namespace {

using nvio::EngineKind;
using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::Request;
using nvio_test::run_within;

// Skips the calling test where the engine cannot be made (GTEST_SKIP in a helper returns from the
// helper only: the macro wraps the check so that the test body returns too).
#define NVIO_SKIP_UNLESS_AVAILABLE(kind)                                            \
  do {                                                                              \
    const nvio::EngineProbe& probe_ = nvio::probe_engine(kind);                     \
    if (!probe_.available) GTEST_SKIP() << "engine unavailable: " << probe_.reason; \
  } while (false)

// Owns both ends of a pipe.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() {
    if (::pipe(fds) != 0) ADD_FAILURE() << "pipe: " << std::strerror(errno);
  }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

// Reads from an empty pipe wait for ever unless cancelled: io_uring's cancel must end every one
// of them, each still reported once through reap(), and the engine's own cancel request never.
TEST(IoUringEngine, CancelEndsReadsThatWouldWaitForEver) {
  NVIO_SKIP_UNLESS_AVAILABLE(EngineKind::IoUring);
  Pipe pipe;
  constexpr unsigned kDepth = 8;
  run_within(std::chrono::seconds(20), "cancel and reap", [&] {
    auto engine = nvio::engine::make_io_uring_engine(kDepth);
    std::vector<char> bufs(kDepth * 16);
    std::vector<Request> requests;
    for (unsigned i = 0; i < kDepth; ++i) {
      requests.push_back(Request{pipe.fds[0], Direction::Read, &bufs[i * 16], 16, 0,
                                 0xFFFF'0000'0000'0000ULL | i});
    }
    ASSERT_EQ(engine->submit(requests), static_cast<int>(kDepth));
    std::vector<Completion> out(kDepth * 2);
    EXPECT_EQ(engine->reap(out, 0), 0);  // nothing can complete yet
    ASSERT_EQ(engine->cancel(), 0);
    std::set<std::uint64_t> seen;
    while (seen.size() < kDepth) {
      const int got = engine->reap(out, 1);
      ASSERT_GT(got, 0);
      for (int i = 0; i < got; ++i) {
        EXPECT_EQ(out[i].result, -ECANCELED);
        EXPECT_TRUE(seen.insert(out[i].tag).second) << "tag reported twice: " << out[i].tag;
        EXPECT_EQ(out[i].tag & 0xFFFF'0000'0000'0000ULL, 0xFFFF'0000'0000'0000ULL);
        EXPECT_LT(out[i].tag & 0xFFFF, kDepth);
      }
    }
    EXPECT_EQ(engine->reap(out, 0), 0);  // nothing else, in particular no cancel CQE
    EXPECT_EQ(engine->cancel(), 0);      // nothing left to cancel
  });
}

// How many io_uring_submit calls from now on the kernel refuses, and with which errno.
std::atomic<int> g_refusals{0};
std::atomic<int> g_refusal_errno{EAGAIN};

int refusing_submit(io_uring* ring) {
  if (g_refusals.load() > 0) {
    g_refusals.fetch_sub(1);
    return -g_refusal_errno.load();
  }
  return nvio::engine::real_io_uring_calls().submit(ring);
}

class IoUringRefusedSubmit : public ::testing::TestWithParam<int> {};

// Defect 4: the SQEs of a refused io_uring_submit stay in the ring, accepted but not in the
// kernel. A reap that waits for them (overlap_events=false waits for the whole batch) waited for
// ever when the kernel refused again; it must return (-EAGAIN: nothing to report yet), and the
// requests must all complete, with their data, once the kernel takes them.
TEST_P(IoUringRefusedSubmit, ReapNeverWaitsForRequestsTheKernelDoesNotHold) {
  NVIO_SKIP_UNLESS_AVAILABLE(EngineKind::IoUring);
  constexpr unsigned kCount = 8;
  constexpr std::size_t kLen = 4095;
  constexpr std::uint64_t kSeed = 41;
  nvio_test::TempDir dir;
  const std::string path = dir.file("data");
  nvio_test::write_pattern_file(path, kCount * 4096, kSeed);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  g_refusal_errno = GetParam();
  run_within(std::chrono::seconds(20), "reap after a refused submit", [&] {
    nvio::engine::IoUringCalls calls = nvio::engine::real_io_uring_calls();
    calls.submit = refusing_submit;
    auto engine = nvio::engine::make_io_uring_engine(kCount, calls);
    std::vector<unsigned char> bufs(kCount * kLen, nvio_test::kSentinel);
    std::vector<Request> requests;
    for (unsigned i = 0; i < kCount; ++i) {
      requests.push_back(Request{fd, Direction::Read, &bufs[i * kLen], kLen, i * 4096ULL,
                                 0x8000'0000'0000'0000ULL | i});
    }
    g_refusals = 4;  // the submit, then the reaps' own tries to hand the SQEs over
    ASSERT_EQ(engine->submit(requests), static_cast<int>(kCount));
    std::vector<Completion> out(kCount);
    EXPECT_EQ(engine->reap(out, kCount), -EAGAIN);
    EXPECT_EQ(engine->reap(out, 1), -EAGAIN);
    EXPECT_EQ(engine->reap(out, 0), 0);  // does not wait, and has nothing
    EXPECT_EQ(g_refusals.load(), 0) << "the refusals were not all used";
    std::set<std::uint64_t> seen;
    for (int round = 0; round < 100 && seen.size() < kCount; ++round) {
      const int got = engine->reap(out, kCount - seen.size());
      ASSERT_GT(got, 0);
      for (int i = 0; i < got; ++i) {
        const std::uint64_t index = out[i].tag & 0xFF;
        EXPECT_TRUE(seen.insert(out[i].tag).second);
        ASSERT_EQ(out[i].result, static_cast<std::int64_t>(kLen));
        EXPECT_TRUE(nvio_test::buffer_has_pattern(&bufs[index * kLen], kLen, index * 4096, kSeed));
      }
    }
    EXPECT_EQ(seen.size(), kCount);
  });
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Errno, IoUringRefusedSubmit, ::testing::Values(EAGAIN, EBUSY),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == EAGAIN ? "EAGAIN" : "EBUSY");
                         });

}  // namespace
