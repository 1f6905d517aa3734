// Tests of single back ends at the engine level: what the Engine contract suite
// (engine_contract_test.cpp) cannot provoke through the kernel's ordinary behaviour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "nvio/system.hpp"

namespace {

using nvio::EngineKind;
using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::Request;
using nvio_test::run_within;

void skip_unless_available(EngineKind kind) {
  const nvio::EngineProbe& probe = nvio::probe_engine(kind);
  if (!probe.available) GTEST_SKIP() << "engine unavailable: " << probe.reason;
}

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
  skip_unless_available(EngineKind::IoUring);
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

}  // namespace
