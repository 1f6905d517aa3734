// A handle's worker threads failing: the system refusing to start one (the handle's constructor
// reports a typed error and joins the workers already started), and an exception escaping a
// worker's loop (the operations fail with a typed error, later calls say the worker died, and
// the process goes on).
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "handle/worker_threads.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;

// The number of threads of this process.
int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

nvio::Options psync_options(unsigned workers) {
  nvio::Options o;
  o.engine = nvio::EngineKind::Psync;
  o.direct = nvio::DirectIo::Off;
  o.block_size = 64 * KiB;
  o.queue_depth = 4;
  o.intra_op_parallelism = workers;
  return o;
}

// Installs a thread starter for its lifetime that refuses the `fail_at`-th thread (from 1) as
// std::thread does when the system has no thread left for the process: std::system_error with
// EAGAIN. The others start as usual.
class RefusingThreadStarter {
 public:
  explicit RefusingThreadStarter(int fail_at)
      : previous_(nvio::detail::set_thread_starter_for_testing(
            [this, fail_at](std::function<void()> body) {
              if (++calls_ == fail_at) {
                throw std::system_error(EAGAIN, std::generic_category(),
                                        "Resource temporarily unavailable");
              }
              return std::thread(std::move(body));
            })) {}
  ~RefusingThreadStarter() { nvio::detail::set_thread_starter_for_testing(std::move(previous_)); }
  RefusingThreadStarter(const RefusingThreadStarter&) = delete;
  RefusingThreadStarter& operator=(const RefusingThreadStarter&) = delete;
  int calls() const { return calls_.load(); }

 private:
  std::atomic<int> calls_{0};
  nvio::detail::ThreadStarter previous_;
};

// The third of four worker threads cannot be started: the constructor throws MemoryError with
// EAGAIN and the numbers, the two workers already running are stopped and joined (the process
// has as many threads as before), and nothing ends the process. Run in a child process, so that
// a std::terminate there fails this test only.
TEST(WorkerThreads, RefusedThreadIsATypedErrorAndTheStartedOnesAreJoined) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  TempDir dir;
  const std::string path = dir.file("f.bin");
  write_pattern_file(path, 256 * KiB, 4);
  const int status = run_in_child([&] {
    const int before = thread_count();
    {
      RefusingThreadStarter starter(3);
      try {
        nvio::Handle h(psync_options(4));
        return 1;  // no error
      } catch (const nvio::MemoryError& e) {
        const std::string what = e.what();
        if (e.error_code() != EAGAIN) return 2;
        if (!contains(what, "EAGAIN") || !contains(what, "worker thread 3 of 4")) return 3;
        if (!contains(what, "intra_op_parallelism")) return 4;
      }
      if (starter.calls() != 3) return 5;  // no thread after the refused one is tried
    }
    if (thread_count() != before) return 6;  // the started workers were joined
    // The failure left nothing behind: a handle made afterwards works.
    nvio::Handle h(psync_options(4));
    std::vector<unsigned char> buf(256 * KiB, kSentinel);
    h.read(buf.data(), buf.size(), path, 0);
    if (!buffer_has_pattern(buf.data(), buf.size(), 0, 4)) return 7;
    return 0;
  });
  EXPECT_EQ(status, 0) << "1: no error, 2-4: wrong errno or message, 5: threads tried after the "
                          "refused one, 6: workers left running, 7: a later handle failed, "
                          "98: another exception, 134: std::terminate, -1: hang";
}

// What the test engine throws, and when.
enum class Throw {
  SubmitBadAlloc,      // every submit throws std::bad_alloc before the request reaches the kernel
  ReapBadAllocOnce,    // the first reap throws std::bad_alloc after the transfer was submitted
  SubmitRuntimeError,  // every submit throws std::runtime_error
};

// A psync engine that throws where the Throw value says.
class ThrowingEngine final : public nvio::engine::Engine {
 public:
  ThrowingEngine(std::unique_ptr<nvio::engine::Engine> inner, Throw mode)
      : inner_(std::move(inner)), mode_(mode) {}
  int submit(std::span<const nvio::engine::Request> requests) override {
    if (mode_ == Throw::SubmitBadAlloc) throw std::bad_alloc();
    if (mode_ == Throw::SubmitRuntimeError) throw std::runtime_error("injected by the test");
    return inner_->submit(requests);
  }
  int reap(std::span<nvio::engine::Completion> out, std::size_t min_complete) override {
    if (mode_ == Throw::ReapBadAllocOnce && !thrown_) {
      thrown_ = true;
      throw std::bad_alloc();
    }
    return inner_->reap(out, min_complete);
  }
  int cancel() override { return inner_->cancel(); }
  nvio::EngineKind kind() const noexcept override { return nvio::EngineKind::Psync; }

 private:
  std::unique_ptr<nvio::engine::Engine> inner_;
  Throw mode_;
  bool thrown_ = false;
};

class WorkerEscape : public ::testing::TestWithParam<Throw> {
 protected:
  // Whether `e` is the error this test's engine should cause.
  void check_error(const nvio::Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "worker thread")) << what;
    EXPECT_TRUE(contains(what, "runs no more operations")) << what;
    if (GetParam() == Throw::SubmitRuntimeError) {
      EXPECT_EQ(dynamic_cast<const nvio::MemoryError*>(&e), nullptr) << what;
      EXPECT_TRUE(contains(what, "std::runtime_error: injected by the test")) << what;
    } else {
      const auto* m = dynamic_cast<const nvio::MemoryError*>(&e);
      ASSERT_NE(m, nullptr) << what;
      EXPECT_EQ(m->error_code(), ENOMEM);
      EXPECT_TRUE(contains(what, "bad_alloc")) << what;
    }
  }
  // Runs `call`, which must throw the worker's error, within a time limit.
  template <class Call>
  void expect_worker_error(const char* what, Call&& call) {
    SCOPED_TRACE(what);
    run_within(20s, what, [&] {
      try {
        call();
        ADD_FAILURE() << "no exception";
      } catch (const nvio::Error& e) {
        check_error(e);
      }
    });
  }

  ScopedEngineFactory engines_{[mode = GetParam()](nvio::EngineKind, unsigned qd) {
    return std::make_unique<ThrowingEngine>(nvio::engine::make_psync_engine(qd), mode);
  }};
  TempDir dir_;
};

// A blocking read fails with the typed error; later calls say the worker died; the handle can
// still be destroyed.
TEST_P(WorkerEscape, BlockingCallRaisesATypedError) {
  const std::string path = dir_.file("f.bin");
  write_pattern_file(path, 512 * KiB, 6);
  std::vector<unsigned char> buf(512 * KiB, kSentinel);
  auto h = std::make_unique<nvio::Handle>(psync_options(2));
  expect_worker_error("read", [&] { h->read(buf.data(), buf.size(), path, 0); });
  expect_worker_error("a later write", [&] { h->write(buf.data(), 4096, path, 0); });
  expect_worker_error("a later submit", [&] { h->submit_read(buf.data(), 4096, path, 0); });
  EXPECT_EQ(h->pending(), 0u);
  run_within(20s, "the handle's destructor", [&] { h.reset(); });
}

// An asynchronous read: its wait raises the typed error, and so does wait() for all.
TEST_P(WorkerEscape, AsyncWaitRaisesATypedError) {
  const std::string path = dir_.file("f.bin");
  write_pattern_file(path, 512 * KiB, 7);
  std::vector<unsigned char> buf(512 * KiB, kSentinel);
  auto h = std::make_unique<nvio::Handle>(psync_options(2));
  nvio::Ticket first = 0;
  nvio::Ticket second = 0;
  try {
    first = h->submit_read(buf.data(), 256 * KiB, path, 0);
    second = h->submit_read(buf.data() + 256 * KiB, 256 * KiB, path, 256 * KiB);
  } catch (const nvio::Error& e) {
    // A worker may have died on the first before the second was submitted.
    check_error(e);
  }
  ASSERT_NE(first, 0u);
  expect_worker_error("wait(ticket)", [&] { h->wait(first); });
  if (second != 0) expect_worker_error("wait()", [&] { h->wait(); });
  EXPECT_EQ(h->pending(), 0u);
  run_within(20s, "the handle's destructor", [&] { h.reset(); });
}

INSTANTIATE_TEST_SUITE_P(Throws, WorkerEscape,
                         ::testing::Values(Throw::SubmitBadAlloc, Throw::ReapBadAllocOnce,
                                           Throw::SubmitRuntimeError),
                         [](const ::testing::TestParamInfo<Throw>& info) {
                           switch (info.param) {
                             case Throw::SubmitBadAlloc: return std::string("SubmitBadAlloc");
                             case Throw::ReapBadAllocOnce: return std::string("ReapBadAllocOnce");
                             case Throw::SubmitRuntimeError:
                               return std::string("SubmitRuntimeError");
                           }
                           return std::string("?");
                         });

}  // namespace
}  // namespace nvio_test
