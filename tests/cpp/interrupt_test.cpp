// Cancelling operations (Handle::cancel) and interrupting waits (nvio/interrupt.hpp), on every
// engine. The engines here hold back the completions of chosen descriptors until a gate opens, so
// that an operation is reliably in flight, with pieces not started yet, when it is cancelled or
// its wait is interrupted.
#include "nvio/interrupt.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "held_engine.hpp"
#include "nvio/nvio.hpp"
#include "test_util.hpp"

namespace nvio_test {
// Named, not anonymous: the sanitizer builds compile the tests as unity sources.
namespace cancel_tests {

using namespace std::chrono_literals;

// Holds the completions of requests on `fd` (every descriptor when -1) while closed.
class FdGate final : public CompletionGate {
 public:
  bool holds(const nvio::engine::Request& r) override {
    const int gated = fd.load();
    return gated < 0 || gated == r.fd;
  }
  // Waits until `n` requests it holds were accepted (a worker submits them when it gets to them).
  void wait_held(std::uint64_t n) const {
    run_within(std::chrono::seconds(60), "held requests reaching the engine", [&] {
      while (held.load() < n) std::this_thread::sleep_for(1ms);
    });
  }
  std::atomic<int> fd{-1};
};

// A check that answers true from the `from`-th call on once `ready()` holds (false before),
// counting its calls and the calls after its first true answer (a wait that drains must not ask).
class CountingCheck final : public nvio::InterruptCheck {
 public:
  explicit CountingCheck(
      unsigned from = 1, std::function<bool()> ready = [] { return true; })
      : from_(from), ready_(std::move(ready)) {}
  bool interrupted() noexcept override {
    const unsigned n = ++calls;
    if (stopped.load()) ++after_stop;
    if (n < from_ || !ready_()) return false;
    stopped = true;
    return true;
  }
  std::atomic<unsigned> calls{0};
  std::atomic<bool> stopped{false};
  std::atomic<unsigned> after_stop{0};

 private:
  unsigned from_;
  std::function<bool()> ready_;
};

// Opens `gate` from a thread of its own once `check` has stopped a wait and `cancelled()` holds
// (the stopped call has cancelled what had not started: were the gate opened before, the worker
// could finish every piece first, and the call would rightly end as it would have), so that the
// pieces held are let go only after the interrupt; opened() says whether it has. Joined on
// destruction. Opens anyway after 60 s, so that a failing test fails instead of hanging.
class OpenerAfterStop {
 public:
  OpenerAfterStop(CompletionGate& gate, const CountingCheck& check, std::function<bool()> cancelled)
      : thread_([&gate, &check, cancelled = std::move(cancelled), this] {
          const auto limit = std::chrono::steady_clock::now() + 60s;
          while ((!check.stopped.load() || !cancelled()) &&
                 std::chrono::steady_clock::now() < limit) {
            std::this_thread::sleep_for(1ms);
          }
          opened_ = true;
          gate.open();
        }) {}
  ~OpenerAfterStop() { join(); }
  OpenerAfterStop(const OpenerAfterStop&) = delete;
  OpenerAfterStop& operator=(const OpenerAfterStop&) = delete;
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  bool opened() const { return opened_.load(); }

 private:
  std::atomic<bool> opened_{false};
  std::thread thread_;  // after opened_, which it uses
};

constexpr std::size_t kBlock = 64 * KiB;
constexpr std::size_t kPieces = 16;
constexpr std::size_t kLength = kPieces * kBlock;
constexpr std::uint64_t kSeed = 77;

class Cancel : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped()) return;
    gate_ = std::make_shared<FdGate>();
    factory_.emplace(held_engine_factory(gate_));
    path_ = file("data");
    write_pattern_file(path_, kLength, kSeed);
    fd_ = ::open(path_.c_str(), O_RDWR);
    ASSERT_GE(fd_, 0);
    gate_->fd = fd_;
  }
  void TearDown() override {
    if (gate_) gate_->open();  // nothing may stay held when a failed test leaves
    if (fd_ >= 0) ::close(fd_);
    factory_.reset();
    EngineTest::TearDown();
  }
  // One worker, one request in flight, 16 pieces a transfer: while the first is held, the other
  // fifteen wait in the queue. Buffered: the requests use the caller's descriptor, `fd_`.
  nvio::Options options() const {
    nvio::Options o = base_options();
    o.direct = nvio::DirectIo::Off;
    o.block_size = kBlock;
    o.queue_depth = 1;
    o.intra_op_parallelism = 1;
    return o;
  }
  // The bytes of the buffer read at file offset 0: each 64 KiB piece is either the file's bytes
  // or untouched (the sentinel); returns how many are the file's, failing on anything else.
  std::size_t pieces_read(const std::vector<unsigned char>& buf) const {
    std::size_t read = 0;
    for (std::size_t p = 0; p < kPieces; ++p) {
      const unsigned char* at = buf.data() + p * kBlock;
      if (buffer_has_pattern(at, kBlock, p * kBlock, kSeed)) {
        ++read;
      } else {
        EXPECT_TRUE(std::all_of(at, at + kBlock, [](unsigned char c) { return c == kSentinel; }))
            << "piece " << p << " is neither the file's bytes nor untouched";
      }
    }
    return read;
  }

  std::shared_ptr<FdGate> gate_;
  std::optional<ScopedEngineFactory> factory_;
  std::string path_;
  int fd_ = -1;
};

TEST_P(Cancel, SkipsThePiecesNotStartedAndTheWaitRaisesEcanceled) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  const nvio::Ticket t = h.submit_read(buf.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  EXPECT_TRUE(h.cancel(t));
  gate_->open();
  try {
    h.wait(t);
    FAIL() << "the wait of a cancelled read returned";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), ECANCELED) << e.what();
    EXPECT_EQ(e.offset(), 0u);
    EXPECT_EQ(e.length(), kLength);
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
  // The one piece in flight finished into the buffer; the fifteen queued never started.
  EXPECT_EQ(pieces_read(buf), 1u);
  EXPECT_EQ(gate_->held.load(), 1u);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.stats().errors, (std::map<int, std::uint64_t>{{ECANCELED, 1}}));
  EXPECT_EQ(h.stats().reads, 0u);
  // The handle goes on: the same read, not cancelled, moves every byte.
  std::fill(buf.begin(), buf.end(), kSentinel);
  h.read(buf.data(), kLength, fd_, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
}

TEST_P(Cancel, AWriteCancelledLeavesTheRestOfTheFileAsItWas) {
  nvio::Handle h(options());
  // The pattern of another seed: a piece written where it does not belong shows.
  std::vector<unsigned char> data(kLength);
  nvio::pattern::fill(data.data(), kLength, 0, kSeed + 9);
  const nvio::Ticket t = h.submit_write(data.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  EXPECT_TRUE(h.cancel(t));
  gate_->open();
  try {
    h.wait(t);
    FAIL() << "the wait of a cancelled write returned";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), ECANCELED) << e.what();
    EXPECT_EQ(e.op(), nvio::IoOp::Write);
  }
  const std::vector<unsigned char> file = read_file(path_);
  ASSERT_EQ(file.size(), kLength);
  EXPECT_TRUE(file_range_has_pattern(file, 0, kBlock, kSeed + 9));
  EXPECT_TRUE(file_range_has_pattern(file, kBlock, kLength - kBlock, kSeed));
}

TEST_P(Cancel, AnOperationWhosePiecesAllStartedCompletesAsItWould) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kBlock, kSentinel);
  const nvio::Ticket t = h.submit_read(buf.data(), kBlock, fd_, 3 * kBlock);
  gate_->wait_held(1);
  EXPECT_FALSE(h.cancel(t));  // its one piece is in the kernel
  gate_->open();
  h.wait(t);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kBlock, 3 * kBlock, kSeed));
  EXPECT_THROW(h.cancel(t), nvio::InvalidArgument);  // collected
  EXPECT_THROW(h.cancel(987654), nvio::InvalidArgument);
}

TEST_P(Cancel, ATicketAnotherThreadWaitsForCanBeCancelled) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  const nvio::Ticket t = h.submit_read(buf.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  std::atomic<int> error{0};
  std::thread waiter([&] {
    try {
      h.wait(t);
    } catch (const nvio::IoError& e) {
      error = e.error_code();
    }
  });
  // The waiter takes the ticket from the table as it starts waiting; cancel finds it either way.
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(h.cancel(t));
  gate_->open();
  waiter.join();
  EXPECT_EQ(error.load(), ECANCELED);
  EXPECT_EQ(pieces_read(buf), 1u);
}

TEST_P(Cancel, AnInterruptedBlockingReadCancelsWaitsForTheKernelAndThrows) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  // Stops once the first piece is in the kernel (on a loaded machine the worker may take longer
  // than the first period to get there).
  CountingCheck check(1, [&] { return gate_->held.load() >= 1; });
  // The held piece is let go only once the check has stopped the wait: the read must then still
  // wait for it before it throws (the buffer is the kernel's until then).
  // A cancelled operation with a piece in the kernel finishes only when that piece does, so
  // nothing shows the cancel from outside: the gate opens 200 ms after the stop, time enough for
  // the stopped call to cancel (it has nothing else to do first).
  const auto since_stop = std::make_shared<std::atomic<int>>(0);
  OpenerAfterStop opener(*gate_, check, [since_stop] { return ++*since_stop > 200; });
  {
    nvio::ScopedInterruptCheck scope(check);
    try {
      h.read(buf.data(), kLength, fd_, 0);
      ADD_FAILURE() << "the interrupted read returned";
    } catch (const nvio::Interrupted& e) {
      EXPECT_TRUE(opener.opened()) << "it threw while the kernel still held a piece";
      EXPECT_NE(std::string(e.what()).find(std::to_string(kLength)), std::string::npos) << e.what();
    }
  }
  opener.join();
  EXPECT_EQ(check.after_stop.load(), 0u);
  EXPECT_EQ(pieces_read(buf), 1u);
  EXPECT_EQ(gate_->held.load(), 1u);
  // Without the check the handle reads as before.
  std::fill(buf.begin(), buf.end(), kSentinel);
  h.read(buf.data(), kLength, fd_, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
}

TEST_P(Cancel, AnInterruptedCachedReadWaitsForThePieceTheKernelHolds) {
  // cached_reads=auto: the file was just written, so the read goes through the page cache on the
  // handle's own buffered descriptor (every descriptor is gated). Stopped with its first piece in
  // the kernel, the read must still wait for that piece before it throws.
  if (!direct_supported()) GTEST_SKIP() << "cached reads apply under direct I/O only";
  nvio::Options o = options();
  o.direct = nvio::DirectIo::Auto;
  o.cached_reads = nvio::CachedReads::Auto;
  gate_->fd = -1;
  nvio::Handle h(o);
  std::vector<unsigned char> buf(kLength, kSentinel);
  CountingCheck check(1, [&] { return gate_->held.load() >= 1; });
  const auto since_stop = std::make_shared<std::atomic<int>>(0);
  OpenerAfterStop opener(*gate_, check, [since_stop] { return ++*since_stop > 200; });
  {
    nvio::ScopedInterruptCheck scope(check);
    try {
      h.read(buf.data(), kLength, path_, 0);
      ADD_FAILURE() << "the interrupted read returned";
    } catch (const nvio::Interrupted&) {
      EXPECT_TRUE(opener.opened()) << "it threw while the kernel still held a piece";
    }
  }
  opener.join();
  EXPECT_EQ(pieces_read(buf), 1u);
  // A piece that completes after its operation failed is not counted: the same read again, not
  // interrupted, shows that this file is read through the page cache.
  std::fill(buf.begin(), buf.end(), kSentinel);
  h.read(buf.data(), kLength, path_, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
  EXPECT_EQ(h.stats().cached_bytes, kLength) << "the read did not go through the page cache";
}

TEST_P(Cancel, AnInterruptedBlockingCallWithEveryPieceStartedEndsAsItWould) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kBlock, kSentinel);
  CountingCheck check(1, [&] { return gate_->held.load() >= 1; });
  OpenerAfterStop opener(*gate_, check, [] { return true; });
  {
    nvio::ScopedInterruptCheck scope(check);
    h.read(buf.data(), kBlock, fd_, 2 * kBlock);  // one piece: nothing to cancel, no throw
  }
  opener.join();
  EXPECT_TRUE(check.stopped.load());
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kBlock, 2 * kBlock, kSeed));
  EXPECT_TRUE(h.stats().errors.empty());
}

TEST_P(Cancel, AnInterruptedBlockingBatchCancelsEveryExtent) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  const std::size_t half = kLength / 2;
  const nvio::ReadExtent extents[] = {{buf.data(), half, 0, fd_},
                                      {buf.data() + half, half, half, fd_}};
  CountingCheck check(1, [&] { return gate_->held.load() >= 1; });
  // The second extent has no piece started: cancelled, it finishes at once and is counted.
  OpenerAfterStop opener(*gate_, check, [&] { return h.stats().errors.count(ECANCELED) > 0; });
  {
    nvio::ScopedInterruptCheck scope(check);
    EXPECT_THROW(h.read_batch(extents), nvio::Interrupted);
  }
  opener.join();
  EXPECT_EQ(pieces_read(buf), 1u);
}

TEST_P(Cancel, ABatchOfManyShortWaitsIsAskedEveryPeriodOfTheCall) {
  // 400 extents of one 4 KiB piece, each taking a millisecond: no single wait sleeps for a whole
  // period, yet the call lasts 400 ms and must ask the check on its way.
  gate_->open();
  gate_->delay_us = 1000;
  nvio::Handle h(options());
  constexpr std::size_t kExtents = 400;
  constexpr std::size_t kSmall = 4096;
  std::vector<unsigned char> buf(kExtents * kSmall, kSentinel);
  std::vector<nvio::ReadExtent> extents;
  for (std::size_t i = 0; i < kExtents; ++i) {
    extents.push_back({buf.data() + i * kSmall, kSmall, (i * kSmall) % kLength, fd_});
  }
  CountingCheck check;
  {
    nvio::ScopedInterruptCheck scope(check);
    EXPECT_THROW(h.read_batch(extents), nvio::Interrupted);
  }
  EXPECT_EQ(check.calls.load(), 1u);
  const auto errors = h.stats().errors;
  ASSERT_EQ(errors.count(ECANCELED), 1u);
  EXPECT_GT(errors.at(ECANCELED), kExtents / 4);  // most extents never started
  EXPECT_LT(gate_->held.load(), kExtents);
}

TEST_P(Cancel, ACheckThatSaysNoLetsTheCallFinish) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  CountingCheck check(1000000);
  std::thread opener([&] {
    while (check.calls.load() < 3) std::this_thread::sleep_for(1ms);
    gate_->open();
  });
  {
    nvio::ScopedInterruptCheck scope(check);
    h.read(buf.data(), kLength, fd_, 0);
  }
  opener.join();
  EXPECT_GE(check.calls.load(), 3u);  // asked while it slept, and kept waiting
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
}

TEST_P(Cancel, AnInterruptedWaitForATicketLeavesItOutstanding) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  const nvio::Ticket t = h.submit_read(buf.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  CountingCheck check;
  {
    nvio::ScopedInterruptCheck scope(check);
    EXPECT_THROW(h.wait(t), nvio::Interrupted);
    EXPECT_THROW((void)h.wait_completion(t), nvio::Interrupted);
  }
  EXPECT_EQ(check.calls.load(), 2u);
  EXPECT_TRUE(h.is_pending(t));
  EXPECT_EQ(h.pending(), 1u);
  gate_->open();
  h.wait(t);  // not cancelled: every byte
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
  EXPECT_FALSE(h.is_pending(t));
}

TEST_P(Cancel, AnInterruptedWaitSomeGivesBackWhatItHadCollected) {
  nvio::Handle h(options());
  // A second file, not gated: its read has finished when wait_some starts, which collects it
  // first and then waits for the gated one.
  const std::string other = file("other");
  write_pattern_file(other, kBlock, kSeed + 1);
  std::vector<unsigned char> held(kLength, kSentinel);
  std::vector<unsigned char> quick(kBlock, kSentinel);
  const nvio::Ticket b = h.submit_read(quick.data(), kBlock, other, 0);
  run_within(std::chrono::seconds(60), "the read of the file not gated", [&] {
    while (!h.done(b)) std::this_thread::sleep_for(1ms);
  });
  const nvio::Ticket a = h.submit_read(held.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  std::vector<nvio::Completion> out(2);
  CountingCheck check;
  {
    nvio::ScopedInterruptCheck scope(check);
    EXPECT_THROW(h.wait_some(out, 2), nvio::Interrupted);
    EXPECT_THROW(h.wait(), nvio::Interrupted);
  }
  EXPECT_EQ(h.pending(), 2u);
  EXPECT_TRUE(h.is_pending(a));
  EXPECT_TRUE(h.is_pending(b));
  gate_->open();
  std::set<nvio::Ticket> seen;
  // A ticket given back but not listed as finished would leave this wait asleep for ever.
  run_within(std::chrono::seconds(60), "wait_some for the tickets given back", [&] {
    while (seen.size() < 2) {
      const std::size_t n = h.wait_some(out, 1);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_FALSE(out[i].error);
        EXPECT_TRUE(seen.insert(out[i].ticket).second) << "ticket " << out[i].ticket << " twice";
      }
    }
  });
  EXPECT_EQ(seen, (std::set<nvio::Ticket>{a, b}));
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_TRUE(buffer_has_pattern(held.data(), kLength, 0, kSeed));
  EXPECT_TRUE(buffer_has_pattern(quick.data(), kBlock, 0, kSeed + 1));
}

TEST_P(Cancel, AnInterruptedWaitAllLeavesTheTicketsForTheNextWait) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  h.submit_read(buf.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  CountingCheck check;
  {
    nvio::ScopedInterruptCheck scope(check);
    EXPECT_THROW(h.wait(), nvio::Interrupted);
  }
  gate_->open();
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
}

TEST_P(Cancel, ScopesNestAndTheInnerCheckIsTheOneAsked) {
  nvio::Handle h(options());
  std::vector<unsigned char> buf(kLength, kSentinel);
  const nvio::Ticket t = h.submit_read(buf.data(), kLength, fd_, 0);
  gate_->wait_held(1);
  CountingCheck never(1000000);
  CountingCheck now;
  std::thread opener([&] {
    while (never.calls.load() == 0) std::this_thread::sleep_for(1ms);
    gate_->open();
  });
  {
    nvio::ScopedInterruptCheck outer(never);
    {
      nvio::ScopedInterruptCheck inner(now);
      EXPECT_THROW(h.wait(t), nvio::Interrupted);
    }
    EXPECT_EQ(never.calls.load(), 0u);
    h.wait(t);  // the outer check again: asked, says no, and the wait goes on to the end
  }
  opener.join();
  EXPECT_EQ(now.calls.load(), 1u);
  EXPECT_GE(never.calls.load(), 1u);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, kSeed));
}

TEST_P(Cancel, AnInterruptedStripedReadCancelsAndDrainsEveryDrive) {
  // Two drives, every request held: each drive's first piece stays in the kernel until the gate
  // opens, after the interrupt, and the read must wait for both before it throws.
  gate_->fd = -1;
  TempDir a;
  TempDir b;
  nvio::StripedHandle striped(nvio::StripeLayout{{a.path(), b.path()}, kBlock},
                              std::vector<nvio::Options>(2, options()));
  std::vector<unsigned char> data(kLength);
  for (std::size_t i = 0; i < kLength; ++i) data[i] = static_cast<unsigned char>(i * 7 + 1);
  gate_->open();
  striped.write(data.data(), kLength, "s");
  gate_->close();
  const std::uint64_t before = gate_->held.load();
  std::vector<unsigned char> buf(kLength, kSentinel);
  CountingCheck check(1, [&] { return gate_->held.load() - before >= 2; });
  // Each drive's later extents (7 of its 8) have no piece started: cancelled, they finish at once.
  OpenerAfterStop opener(*gate_, check, [&] {
    const auto errors = striped.stats().errors;
    const auto it = errors.find(ECANCELED);
    return it != errors.end() && it->second >= kPieces - 2;
  });
  {
    nvio::ScopedInterruptCheck scope(check);
    try {
      striped.read(buf.data(), kLength, "s");
      ADD_FAILURE() << "the interrupted striped read returned";
    } catch (const nvio::Interrupted&) {
      EXPECT_TRUE(opener.opened()) << "it threw while a drive still held a piece";
    }
  }
  opener.join();
  EXPECT_EQ(check.after_stop.load(), 0u);      // the drain does not ask again
  EXPECT_EQ(gate_->held.load() - before, 2u);  // one piece per drive, the rest cancelled
  std::size_t whole = 0;
  for (std::size_t p = 0; p < kPieces; ++p) {
    const auto at = buf.begin() + static_cast<std::ptrdiff_t>(p * kBlock);
    if (std::equal(at, at + kBlock, data.begin() + static_cast<std::ptrdiff_t>(p * kBlock))) {
      ++whole;
    } else {
      EXPECT_TRUE(std::all_of(at, at + kBlock, [](unsigned char c) { return c == kSentinel; }))
          << "piece " << p;
    }
  }
  EXPECT_EQ(whole, 2u);
}

INSTANTIATE_TEST_SUITE_P(Engines, Cancel, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace cancel_tests
}  // namespace nvio_test
