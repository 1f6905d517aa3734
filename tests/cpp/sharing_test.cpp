// One handle shared by several threads, and a handle used after fork(), per engine. The rules
// under test are stated in include/nvio/handle.hpp ("Thread-safety", "fork()").
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "core/fork.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::Handle;
using nvio::Options;

// Slow enough on every engine that an early return is seen: many small pieces, one at a time.
Options slow_options(Options o) {
  o.block_size = 4 * KiB;
  o.queue_depth = 1;
  o.intra_op_parallelism = 1;
  return o;
}

class Sharing : public EngineTest {};

// Thread B submits a read; thread A's wait() collects it (and A's own). B's own wait() must not
// return until B's read is complete, even though A's wait is the one that counts it.
TEST_P(Sharing, ConcurrentWaitDoesNotReturnBeforeTheOperationsCollectedByAnother) {
  const std::size_t len = 16 * MiB;
  const std::string path = file("shared.bin");
  write_pattern_file(path, len, 7);
  Handle h(slow_options(base_options()));
  std::vector<unsigned char> a_buf(len, kSentinel);
  std::vector<unsigned char> b_buf(len, kSentinel);
  h.submit_read(a_buf.data(), len, path, 0);
  h.submit_read(b_buf.data(), len, path, 0);
  std::size_t a_count = 0;
  std::thread a([&] { a_count = h.wait(); });
  // A has taken both tickets once none is pending.
  while (h.pending() != 0) std::this_thread::yield();
  const std::size_t b_count = h.wait();
  EXPECT_TRUE(buffer_has_pattern(b_buf.data(), len, 0, 7)) << "B's wait returned before its read";
  EXPECT_TRUE(buffer_has_pattern(a_buf.data(), len, 0, 7));
  a.join();
  EXPECT_EQ(a_count + b_count, 2u) << "each operation is counted by exactly one wait";
}

// The failure of an operation collected by another thread's wait is raised by this wait too: a
// thread is never told "done" about an operation that failed.
TEST_P(Sharing, ConcurrentWaitRaisesTheFailureOfOperationsCollectedByAnother) {
  const std::size_t len = 8 * MiB;
  const std::string path = file("ro.bin");
  write_pattern_file(path, len, 3);
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  Handle h(slow_options(base_options()));
  std::vector<unsigned char> a_buf(len, kSentinel);
  std::vector<unsigned char> b_buf(len, kSentinel);
  h.submit_read(a_buf.data(), len, path, 0);
  h.submit_write(b_buf.data(), len, ro, 0);  // EBADF when it runs
  std::atomic<bool> a_threw{false};
  std::thread a([&] {
    try {
      h.wait();
    } catch (const nvio::IoError&) {
      a_threw = true;
    }
  });
  while (h.pending() != 0) std::this_thread::yield();
  EXPECT_THROW(h.wait(), nvio::IoError);
  a.join();
  EXPECT_TRUE(a_threw.load());
  ::close(ro);
}

// Two threads each submitting and waiting on one handle, many times: every wait returns with the
// thread's own data complete.
TEST_P(Sharing, ThreadsSubmittingAndWaitingOnOneHandle) {
  const std::size_t len = 1 * MiB + 123;
  const std::string path = file("many.bin");
  write_pattern_file(path, len, 11);
  Handle h(slow_options(base_options()));
  std::atomic<int> bad{0};
  auto body = [&] {
    std::vector<unsigned char> buf(len);
    for (int i = 0; i < 10; ++i) {
      std::fill(buf.begin(), buf.end(), kSentinel);
      h.submit_read(buf.data(), len, path, 0);
      h.wait();
      if (!buffer_has_pattern(buf.data(), len, 0, 11)) ++bad;
    }
  };
  std::thread t1(body);
  std::thread t2(body);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(h.pending(), 0u);
}

// ---- fork ------------------------------------------------------------------------------------

TEST_P(Sharing, ForkedChildUsesItsParentsHandle) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  const std::size_t len = 4 * MiB + 123;
  const std::string path = file("fork.bin");
  write_pattern_file(path, len, 5);
  auto h = std::make_unique<Handle>(base_options());
  std::vector<unsigned char> buf(len, kSentinel);
  h->read(buf.data(), len - 1, path, 1);  // the parent's workers are running
  const int status = run_in_child([&] {
    std::vector<unsigned char> mine(len, kSentinel);
    h->read(mine.data(), len - 1, path, 1);
    if (!buffer_has_pattern(mine.data(), len - 1, 1, 5)) return 1;
    const std::string out = file("child.bin");
    h->write(mine.data(), len - 1, out, 3);
    std::fill(mine.begin(), mine.end(), kSentinel);
    h->submit_read(mine.data(), len - 1, out, 3);
    if (h->wait() != 1) return 2;
    if (!buffer_has_pattern(mine.data(), len - 1, 1, 5)) return 3;
    h.reset();  // the child's destructor must not wait for the parent's threads
    return 0;
  });
  EXPECT_EQ(status, 0) << "1-3: wrong data or count in the child, 98: it threw, -1: it hung";
  // The parent's handle is unaffected.
  std::fill(buf.begin(), buf.end(), kSentinel);
  h->read(buf.data(), len, path, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), len, 0, 5));
}

TEST_P(Sharing, ForkWithOperationsInFlightInTheParent) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  const std::size_t len = 16 * MiB;
  const std::string path = file("inflight.bin");
  write_pattern_file(path, len, 9);
  Handle h(slow_options(base_options()));
  std::vector<unsigned char> buf(len, kSentinel);
  h.submit_read(buf.data(), len, path, 0);
  const int status = run_in_child([&] {
    // The parent's operation is not the child's: nothing is pending here.
    if (h.pending() != 0) return 1;
    if (h.wait() != 0) return 2;
    std::vector<unsigned char> mine(64 * KiB, kSentinel);
    h.read(mine.data(), mine.size(), path, 4096);
    return buffer_has_pattern(mine.data(), mine.size(), 4096, 9) ? 0 : 3;
  });
  EXPECT_EQ(status, 0) << "1-3: wrong state in the child, 98: it threw, -1: it hung";
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), len, 0, 9));
}

TEST_P(Sharing, ForkedChildOnlyDestroysTheHandle) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  auto h = std::make_unique<Handle>(base_options());
  const int status = run_in_child([&] {
    h.reset();
    return 0;
  });
  EXPECT_EQ(status, 0) << "-1: the destructor hung in the child";
}

INSTANTIATE_TEST_SUITE_P(Engines, Sharing, NVIO_ALL_ENGINES, EngineParamName());

// The fork tests' hang detection: a child that never ends is reported (-1), described on stderr
// and killed, and the test goes on.
TEST(RunInChild, HungChildIsKilledAndReported) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  const auto start = std::chrono::steady_clock::now();
  const int status = run_in_child(
      [] {
        for (;;) ::pause();
        return 0;
      },
      std::chrono::seconds(1));
  EXPECT_EQ(status, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90));
}

// Every process-wide mutex the library makes fits the registry (beyond its cap a mutex would not
// be held across fork).
TEST(ForkRegistry, TheLibraryStaysBelowTheCap) {
  const TempDir dir;
  Handle h{Options{}};
  std::vector<unsigned char> buf(64 * KiB, 1);
  const std::string path = dir.file("fork-registry.bin");
  h.write(buf.data(), buf.size(), path, 0);
  h.read(buf.data(), buf.size(), path, 0);
  EXPECT_GT(nvio::detail::fork_mutex_count(), 0u);
  EXPECT_LT(nvio::detail::fork_mutex_count(), nvio::detail::kMaxForkMutexes);
}

}  // namespace
}  // namespace nvio_test
