// The caller lane (handle.cpp, handle/worker.hpp CallerWorker): small direct requests of host
// memory are submitted and reaped by the calling threads themselves. These tests prove which
// requests take it (engines made for threads in turn count what they are given), that every way
// of waiting drives it (wait, wait_some, done() polling, the destructor), that threads sharing a
// handle drive each other's requests byte-exact, and that its failures are typed errors that
// leave the handle working.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;
using nvio::engine::Completion;
using nvio::engine::Engine;
using nvio::engine::EngineUsers;
using nvio::engine::Request;

// What the recording engines saw, by who uses them.
struct LaneLog {
  std::atomic<int> lane_engines{0};     // made for threads in turn (the caller lane)
  std::atomic<int> lane_requests{0};    // requests submitted to those
  std::atomic<int> worker_requests{0};  // requests submitted to the workers' engines
  // Lane engines: completions of requests at this file offset report -EIO (after the transfer).
  std::atomic<std::int64_t> fail_offset{-1};
  // Lane engines: reap() throws std::runtime_error from then on (an engine in an unknown state).
  std::atomic<bool> lane_throws{false};
};

class RecordingEngine final : public Engine {
 public:
  RecordingEngine(std::unique_ptr<Engine> inner, std::shared_ptr<LaneLog> log, bool lane)
      : inner_(std::move(inner)), log_(std::move(log)), lane_(lane) {}
  int submit(std::span<const Request> requests) override {
    const int rc = inner_->submit(requests);
    if (rc > 0) {
      (lane_ ? log_->lane_requests : log_->worker_requests) += rc;
      std::lock_guard lock(mutex_);
      for (int k = 0; k < rc; ++k) offsets_.push_back({requests[k].tag, requests[k].offset});
    }
    return rc;
  }
  int reap(std::span<Completion> out, std::size_t min_complete) override {
    if (lane_ && log_->lane_throws) throw std::runtime_error("the test's lane engine broke");
    const int got = inner_->reap(out, min_complete);
    for (int k = 0; k < got; ++k) {
      Completion& c = out[static_cast<std::size_t>(k)];
      std::uint64_t offset = 0;
      {
        std::lock_guard lock(mutex_);
        for (auto it = offsets_.begin(); it != offsets_.end(); ++it) {
          if (it->first == c.tag) {
            offset = it->second;
            offsets_.erase(it);
            break;
          }
        }
      }
      if (lane_ && static_cast<std::int64_t>(offset) == log_->fail_offset) c.result = -EIO;
    }
    return got;
  }
  int cancel() override { return inner_->cancel(); }
  bool completes_in_background() const noexcept override {
    return inner_->completes_in_background();
  }
  nvio::EngineKind kind() const noexcept override { return inner_->kind(); }

 private:
  std::unique_ptr<Engine> inner_;
  std::shared_ptr<LaneLog> log_;
  bool lane_;
  std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> offsets_;  // tag -> file offset in flight
};

class CallerLane : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (kind() == nvio::EngineKind::Auto) GTEST_SKIP() << "the concrete engines cover it";
    if (!direct_supported()) GTEST_SKIP() << "the lane takes direct requests: no O_DIRECT here";
  }
  bool lane_expected() const { return kind() != nvio::EngineKind::Psync; }
  nvio::Options options() const {
    nvio::Options o = base_options();
    o.queue_depth = 8;
    return o;
  }
  std::shared_ptr<LaneLog> log_ = std::make_shared<LaneLog>();
  ScopedEngineFactory factory_{
      [log = log_](nvio::EngineKind k, unsigned qd, EngineUsers users) -> std::unique_ptr<Engine> {
        const bool lane = users == EngineUsers::ThreadsInTurn;
        if (lane) ++log->lane_engines;
        return std::make_unique<RecordingEngine>(nvio::engine::make_backend_engine(k, qd, users),
                                                 log, lane);
      }};
};

constexpr std::size_t kBlock = 4096;

// Writes `count` blocks of 4 KiB, block i at offset i * 4 KiB holding the pattern of its offset.
std::vector<GuardedBuffer> pattern_blocks(std::size_t count) {
  std::vector<GuardedBuffer> blocks;
  for (std::size_t i = 0; i < count; ++i) {
    blocks.emplace_back(kBlock, BufKind::Aligned);
    blocks.back().fill_pattern(i * kBlock, 7);
  }
  return blocks;
}

bool holds_block(const GuardedBuffer& b, std::size_t index) {
  GuardedBuffer want(kBlock, BufKind::Aligned);
  want.fill_pattern(index * kBlock, 7);
  return std::memcmp(b.data(), want.data(), kBlock) == 0;
}

TEST_P(CallerLane, SmallDirectRequestsTakeTheLaneAndLargeOnesTheWorkers) {
  nvio::Handle h(options());
  const std::string path = file("lane.bin");
  auto blocks = pattern_blocks(32);
  std::vector<nvio::Ticket> tickets;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    tickets.push_back(h.submit_write(blocks[i].data(), kBlock, path, i * kBlock));
  }
  for (const nvio::Ticket t : tickets) h.wait(t);
  std::vector<GuardedBuffer> back;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    back.emplace_back(kBlock, BufKind::Aligned);
    h.read(back.back().data(), kBlock, path, i * kBlock);
    ASSERT_TRUE(holds_block(back.back(), i)) << "block " << i;
  }
  if (lane_expected()) {
    EXPECT_EQ(log_->lane_engines.load(), 1) << "one lane per handle, made on first use";
    // Each request takes the lane unless another thread drives it or it is full: with one
    // thread and 32 writes in a queue of 8, most do.
    EXPECT_GE(log_->lane_requests.load(), 32 + 8);
  } else {
    EXPECT_EQ(log_->lane_requests.load(), 0) << "psync transfers inside submit: no lane";
  }
  // Larger than the lane takes, and an unaligned buffer (bounced): both go to the workers.
  const int before = log_->worker_requests;
  std::vector<unsigned char> big(1024 * 1024 + 4096);
  h.write(big.data() + 1, 512 * 1024, path, 0);
  h.write(big.data(), kBlock, path, 0);  // a std::vector's memory: not 4 KiB aligned
  EXPECT_GE(log_->worker_requests - before, 2);
}

TEST_P(CallerLane, OffIsOff) {
  nvio::Options o = options();
  o.caller_lane = false;
  nvio::Handle h(o);
  auto blocks = pattern_blocks(4);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    h.write(blocks[i].data(), kBlock, file("off.bin"), i * kBlock);
  }
  EXPECT_EQ(log_->lane_engines.load(), 0);
  EXPECT_GE(log_->worker_requests.load(), 4);
}

// Every way of waiting completes a request on the lane, also from a thread that did not submit it.
TEST_P(CallerLane, EveryWayOfWaitingDrivesTheLane) {
  nvio::Handle h(options());
  const std::string path = file("ways.bin");
  auto blocks = pattern_blocks(8);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    h.write(blocks[i].data(), kBlock, path, i * kBlock);
  }
  GuardedBuffer a(kBlock, BufKind::Aligned);
  run_within(60s, "polling done()", [&] {
    const nvio::Ticket t = h.submit_read(a.data(), kBlock, path, 1 * kBlock);
    while (!h.done(t)) {
    }
    h.wait(t);
  });
  EXPECT_TRUE(holds_block(a, 1));
  run_within(60s, "wait_some with min_count 0, in a loop", [&] {
    h.submit_read(a.data(), kBlock, path, 2 * kBlock);
    nvio::Completion c[1];
    while (h.wait_some(c, 0) == 0) {
    }
    EXPECT_FALSE(c[0].error);
  });
  EXPECT_TRUE(holds_block(a, 2));
  run_within(60s, "wait(ticket) on another thread", [&] {
    const nvio::Ticket t = h.submit_read(a.data(), kBlock, path, 3 * kBlock);
    std::thread other([&] { h.wait(t); });
    other.join();
  });
  EXPECT_TRUE(holds_block(a, 3));
  run_within(60s, "wait() on another thread", [&] {
    h.submit_read(a.data(), kBlock, path, 4 * kBlock);
    std::thread other([&] { EXPECT_EQ(h.wait(), 1u); });
    other.join();
  });
  EXPECT_TRUE(holds_block(a, 4));
}

// Without overlap_events the lane starts nothing while pieces are in flight: requests wait in
// its queue for the batch before them, and must still be driven to the end.
TEST_P(CallerLane, RequestsWaitingForASlotAreDrivenToTheEnd) {
  nvio::Options o = options();
  o.overlap_events = false;
  nvio::Handle h(o);
  const std::string path = file("queued.bin");
  auto blocks = pattern_blocks(32);
  run_within(60s, "32 writes without overlap_events", [&] {
    std::vector<nvio::Ticket> tickets;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      tickets.push_back(h.submit_write(blocks[i].data(), kBlock, path, i * kBlock));
    }
    for (auto t = tickets.rbegin(); t != tickets.rend(); ++t) h.wait(*t);
  });
  const std::vector<unsigned char> bytes = read_file(path);
  ASSERT_EQ(bytes.size(), blocks.size() * kBlock);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(std::memcmp(bytes.data() + i * kBlock, blocks[i].data(), kBlock), 0) << i;
  }
}

TEST_P(CallerLane, DestroyingTheHandleCompletesItsRequests) {
  const std::string path = file("destroy.bin");
  auto blocks = pattern_blocks(8);
  {
    nvio::Handle h(options());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      h.submit_write(blocks[i].data(), kBlock, path, i * kBlock);
    }
  }  // never waited for: the destructor completes them before the buffers may go
  const std::vector<unsigned char> bytes = read_file(path);
  ASSERT_EQ(bytes.size(), blocks.size() * kBlock);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(std::memcmp(bytes.data() + i * kBlock, blocks[i].data(), kBlock), 0) << i;
  }
}

// Four threads share one handle, each with its own part of the file: asynchronous writes and
// reads waited for in different ways, so that each thread's requests are often reaped by another.
TEST_P(CallerLane, ThreadsSharingAHandleDriveEachOthersRequests) {
  nvio::Handle h(options());
  const std::string path = file("shared.bin");
  constexpr std::size_t kPerThread = 64;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t first = t * kPerThread;
      std::vector<GuardedBuffer> out;
      for (std::size_t i = 0; i < kPerThread; ++i) {
        out.emplace_back(kBlock, BufKind::Aligned);
        out.back().fill_pattern((first + i) * kBlock, 7);
      }
      for (int round = 0; round < 3; ++round) {
        std::vector<nvio::Ticket> tickets;
        for (std::size_t i = 0; i < kPerThread; ++i) {
          tickets.push_back(h.submit_write(out[i].data(), kBlock, path, (first + i) * kBlock));
        }
        for (const nvio::Ticket k : tickets) h.wait(k);
        std::vector<GuardedBuffer> in;
        tickets.clear();
        for (std::size_t i = 0; i < kPerThread; ++i) {
          in.emplace_back(kBlock, BufKind::Aligned);
          tickets.push_back(h.submit_read(in.back().data(), kBlock, path, (first + i) * kBlock));
        }
        if (round == 0) {
          for (const nvio::Ticket k : tickets) h.wait(k);
        } else if (round == 1) {
          for (const nvio::Ticket k : tickets) {
            while (!h.done(k)) std::this_thread::yield();
            h.wait(k);
          }
        } else {
          // The last first: the thread waits while its earlier requests complete by any driver.
          for (auto k = tickets.rbegin(); k != tickets.rend(); ++k) h.wait(*k);
        }
        for (std::size_t i = 0; i < kPerThread; ++i) {
          if (!holds_block(in[i], first + i)) ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_P(CallerLane, AFailedRequestOnTheLaneIsATypedErrorAndTheRestSucceed) {
  if (!lane_expected()) GTEST_SKIP() << "psync has no lane";
  nvio::Handle h(options());
  const std::string path = file("fail.bin");
  auto blocks = pattern_blocks(8);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    h.write(blocks[i].data(), kBlock, path, i * kBlock);
  }
  log_->fail_offset = 5 * kBlock;
  std::vector<GuardedBuffer> in;
  std::vector<nvio::Ticket> tickets;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    in.emplace_back(kBlock, BufKind::Aligned);
    tickets.push_back(h.submit_read(in.back().data(), kBlock, path, i * kBlock));
  }
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    if (i == 5) {
      try {
        h.wait(tickets[i]);
        ADD_FAILURE() << "the failed read reported success";
      } catch (const nvio::IoError& e) {
        EXPECT_EQ(e.error_code(), EIO);
        EXPECT_NE(std::string(e.what()).find("fail.bin"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::to_string(5 * kBlock)), std::string::npos)
            << e.what();
      }
    } else {
      h.wait(tickets[i]);
      EXPECT_TRUE(holds_block(in[i], i)) << i;
    }
  }
  log_->fail_offset = -1;
  h.read(in[5].data(), kBlock, path, 5 * kBlock);
  EXPECT_TRUE(holds_block(in[5], 5));
}

TEST_P(CallerLane, ALaneThatBreaksFailsItsRequestsAndTheWorkersTakeOver) {
  if (!lane_expected()) GTEST_SKIP() << "psync has no lane";
  nvio::Handle h(options());
  const std::string path = file("broken.bin");
  auto blocks = pattern_blocks(4);
  h.write(blocks[0].data(), kBlock, path, 0);
  log_->lane_throws = true;
  try {
    h.write(blocks[1].data(), kBlock, path, kBlock);
    ADD_FAILURE() << "a write whose engine broke reported success";
  } catch (const nvio::Error& e) {
    EXPECT_NE(std::string(e.what()).find("caller lane"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the test's lane engine broke"), std::string::npos)
        << e.what();
  }
  const int before = log_->worker_requests;
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    h.write(blocks[i].data(), kBlock, path, i * kBlock);
  }
  EXPECT_GE(log_->worker_requests - before, 3) << "the workers took the lane's requests over";
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    GuardedBuffer in(kBlock, BufKind::Aligned);
    h.read(in.data(), kBlock, path, i * kBlock);
    EXPECT_TRUE(holds_block(in, i)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, CallerLane, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace
}  // namespace nvio_test
