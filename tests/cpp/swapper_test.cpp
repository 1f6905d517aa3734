// The tensor swapper (include/nvio/swapper.hpp): random sequences of swap_out / swap_in /
// prefetch / evict under a tight budget with every byte compared against the pattern, the budget
// never exceeded and its typed error, checksum mismatches, the directory's lock, the clean-up after
// a crashed owner, close and snapshots.
#include "nvio/swapper.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "held_engine.hpp"
#include "test_util.hpp"

namespace nvio_test {
// Named, so that a unity build (scripts/test.sh) can put this file beside others' helpers.
namespace swapper {
namespace {

nvio::Options handle_options() {
  nvio::Options o;
  o.block_size = 256 * KiB;
  o.queue_depth = 8;
  o.intra_op_parallelism = 2;
  return o;
}

nvio::SwapperOptions swapper_options(std::uint64_t budget, bool checksums = true) {
  nvio::SwapperOptions o;
  o.budget_bytes = budget;
  o.pack_threshold = 256 * KiB;
  o.pack_file_size = 1 * MiB;  // several pack files, so that whole ones are removed
  o.checksums = checksums;
  return o;
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<unsigned char> pattern(std::size_t size, std::uint64_t seed) {
  std::vector<unsigned char> v(size);
  nvio::pattern::fill(v.data(), size, 0, seed);
  return v;
}

::testing::AssertionResult holds_pattern(const void* data, std::size_t size, std::uint64_t seed,
                                         const std::string& name) {
  if (const auto bad = nvio::pattern::first_mismatch(data, size, 0, seed)) {
    return ::testing::AssertionFailure() << "tensor '" << name << "' (" << size << " bytes, seed "
                                         << seed << "): first wrong byte at " << *bad;
  }
  return ::testing::AssertionSuccess();
}

// Odd sizes from 1 byte to a few MiB, mostly small (a model's many biases and norms).
std::size_t random_size(std::mt19937_64& rng) {
  const auto pick = rng() % 100;
  if (pick < 60) return 1 + rng() % 5000;
  if (pick < 94) return 5000 + rng() % (300 * KiB);
  return 300 * KiB + rng() % (2 * MiB + 777);
}

// One thread's random sequence over its own names; the model is what each name must hold. The
// most names seen waiting in the prefetch queue go to `most_queued`: the budget was tight enough
// for the read-ahead to wait for room.
void random_sequence(nvio::Swapper& swapper, std::uint64_t thread, std::size_t ops,
                     std::size_t names, std::uint64_t* most_queued = nullptr) {
  std::mt19937_64 rng(1234 + thread);
  struct Model {
    std::size_t size;
    std::uint64_t seed;
  };
  std::map<std::string, Model> model;
  // Sources of writes in flight (they must live until written), by swap id.
  std::map<nvio::Swapper::SwapId, std::vector<unsigned char>> sources;
  std::uint64_t next_seed = thread << 40;
  const auto name_of = [&](std::size_t i) {
    return "t" + std::to_string(thread) + "." + std::to_string(i);
  };
  for (std::size_t op = 0; op < ops; ++op) {
    const std::string name = name_of(rng() % names);
    const auto kind = rng() % 100;
    auto known = model.find(name);
    if (kind < 40 || known == model.end()) {
      const std::size_t size =
          known != model.end() && rng() % 3 == 0 ? known->second.size : random_size(rng);
      const std::uint64_t seed = ++next_seed;
      std::vector<unsigned char> source = pattern(size, seed);
      const auto id = swapper.swap_out(name, source.data(), size, nvio::MemoryKind::Host, "m");
      sources.emplace(id, std::move(source));
      model[name] = {size, seed};
    } else if (kind < 60) {
      const auto buffer = swapper.swap_in(name);
      ASSERT_EQ(buffer->size(), known->second.size);
      ASSERT_TRUE(holds_pattern(buffer->data(), buffer->size(), known->second.seed, name));
      if (rng() % 4 == 0) {  // swapped out again straight from the lent buffer
        const auto id =
            swapper.swap_out(name, buffer->data(), buffer->size(), nvio::MemoryKind::Host, "m");
        swapper.wait(id);
      }
    } else if (kind < 75) {
      std::vector<unsigned char> out(known->second.size + 2, kSentinel);
      swapper.swap_in(name, out.data() + 1, known->second.size, nvio::MemoryKind::Host);
      ASSERT_TRUE(holds_pattern(out.data() + 1, known->second.size, known->second.seed, name));
      ASSERT_EQ(out.front(), kSentinel);
      ASSERT_EQ(out.back(), kSentinel);
    } else if (kind < 88) {
      std::vector<std::string> wanted;
      for (int i = 0; i < 8; ++i) {
        const std::string n = name_of(rng() % names);
        if (model.contains(n)) wanted.push_back(n);
      }
      swapper.prefetch(wanted);
    } else if (kind < 95) {
      EXPECT_TRUE(swapper.evict(name));
      model.erase(name);
      EXPECT_FALSE(swapper.contains(name));
    } else {
      for (auto& [id, source] : sources) swapper.wait(id);
      sources.clear();
    }
    // Finished writes release their sources; the rest stay alive.
    for (auto it = sources.begin(); it != sources.end();) {
      it = swapper.done(it->first) ? sources.erase(it) : std::next(it);
    }
    const nvio::SwapperStats stats = swapper.stats();
    ASSERT_LE(stats.held_bytes, stats.budget_bytes);
    if (most_queued != nullptr) *most_queued = std::max(*most_queued, stats.prefetch_queued);
  }
  for (auto& [id, source] : sources) swapper.wait(id);
  sources.clear();
  for (const auto& [name, m] : model) {
    const auto buffer = swapper.swap_in(name);
    ASSERT_TRUE(holds_pattern(buffer->data(), m.size, m.seed, name));
  }
}

TEST(Swapper, RandomSequencesUnderATightBudgetKeepEveryByte) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(6 * MiB), handle_options());
  std::uint64_t most_queued = 0;
  random_sequence(swapper, 0, 1000, 600, &most_queued);
  const nvio::SwapperStats stats = swapper.stats();
  EXPECT_GT(stats.prefetch_hits, 0u);
  // The budget is tight: prefetched names had to wait in the queue for room (prefetch no longer
  // waits for write-behind itself, which is where this sequence's budget_waits came from).
  EXPECT_GT(most_queued, 0u);
  EXPECT_LE(stats.held_bytes, 6 * MiB);
}

TEST(Swapper, ThreadsShareOneSwapper) {
  TempDir dir;
  // Each thread holds at most one buffer lent by swap_in (up to 4 MiB mapped for the largest
  // tensors), and idle slots of slabs in use stay within an eighth of the budget: 16 MiB always
  // has room. A smaller budget may rightly throw BudgetExceeded when all three threads hold a
  // large buffer at once (the swapper does not wait for buffers callers keep).
  nvio::Swapper swapper(dir.path(), swapper_options(16 * MiB), handle_options());
  run_threads(3, [&](unsigned t) { random_sequence(swapper, t + 1, 300, 60); });
  EXPECT_LE(swapper.stats().held_bytes, 16 * MiB);
}

// Writes that take a while (each submit of a write sleeps first), so that a swap_in right after a
// swap_out finds the write still in flight.
class SlowWrites final : public nvio::engine::Engine {
 public:
  explicit SlowWrites(std::unique_ptr<nvio::engine::Engine> inner) : inner_(std::move(inner)) {}
  int submit(std::span<const nvio::engine::Request> requests) override {
    if (!requests.empty() && requests.front().direction == nvio::engine::Direction::Write) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    return inner_->submit(requests);
  }
  int reap(std::span<nvio::engine::Completion> out, std::size_t min_complete) override {
    return inner_->reap(out, min_complete);
  }
  int cancel() override { return inner_->cancel(); }
  nvio::EngineKind kind() const noexcept override { return inner_->kind(); }

 private:
  std::unique_ptr<nvio::engine::Engine> inner_;
};

TEST(Swapper, SwapInWhileTheWriteIsInFlightSeesTheNewBytes) {
  ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new SlowWrites(nvio::engine::make_backend_engine(k, qd)));
  });
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(64 * MiB), handle_options());
  for (std::uint64_t round = 0; round < 6; ++round) {
    const std::size_t size = round % 2 ? 3 * MiB + 5 : 4099;  // own file, then a pack
    const std::vector<unsigned char> first = pattern(size, 100 + round);
    const std::vector<unsigned char> second = pattern(size, 200 + round);
    const auto a = swapper.swap_out("x", first.data(), size, nvio::MemoryKind::Host);
    swapper.prefetch(std::vector<std::string>{"x"});
    const auto b = swapper.swap_out("x", second.data(), size, nvio::MemoryKind::Host);
    const auto in = swapper.swap_in("x");
    ASSERT_TRUE(holds_pattern(in->data(), size, 200 + round, "x"));
    swapper.wait(a);
    swapper.wait(b);
  }
}

// Swaps out `count` tensors of distinct sizes from `base` on (each in a file of its own when base
// is at least the pack threshold), waits for the writes; returns their names.
std::vector<std::string> swap_out_many(nvio::Swapper& swapper, std::size_t count,
                                       std::size_t base) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t size = base + i * 4099;
    const auto source = pattern(size, 500 + i);
    names.push_back("q" + std::to_string(i));
    swapper.swap_out(names.back(), source.data(), size, nvio::MemoryKind::Host);
    swapper.wait();
  }
  return names;
}

TEST(Swapper, APrefetchOfMoreThanTheBudgetHoldsIsReadAheadAsSwapInsFreeRoom) {
  TempDir dir;
  const std::size_t base = 300 * KiB;  // about 7 fit in the budget, 24 are asked for
  nvio::Swapper swapper(dir.path(), swapper_options(2 * MiB + 256 * KiB), handle_options());
  const std::vector<std::string> names = swap_out_many(swapper, 24, base);
  const nvio::SwapperStats before = swapper.stats();
  EXPECT_EQ(swapper.prefetch(names), names.size());  // started or queued
  const nvio::SwapperStats queued = swapper.stats();
  EXPECT_GT(queued.prefetch_queued, 10u);
  // Every name is queued or being read (a read finishes only when a call collects it).
  EXPECT_EQ(queued.prefetch_queued + queued.reads_in_flight, names.size());
  EXPECT_EQ(swapper.prefetch(names), 0u);  // all in the read-ahead already
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::size_t size = base + i * 4099;
    bytes += size;
    if (i % 3 == 2) {  // a lent buffer, dropped before the next swap_in
      const auto lent = swapper.swap_in(names[i]);
      ASSERT_EQ(lent->size(), size);
      ASSERT_TRUE(holds_pattern(lent->data(), size, 500 + i, names[i]));
      continue;
    }
    std::vector<unsigned char> out(size + 2, kSentinel);
    swapper.swap_in(names[i], out.data() + 1, size, nvio::MemoryKind::Host);
    ASSERT_TRUE(holds_pattern(out.data() + 1, size, 500 + i, names[i]));
    ASSERT_EQ(out.front(), kSentinel);
    ASSERT_EQ(out.back(), kSentinel);
    ASSERT_LE(swapper.stats().held_bytes, swapper.stats().budget_bytes);
  }
  // Every swap_in was served from prefetched data, the names past the first budget's worth too:
  // each swap_in consumed its name's buffer and started the next queued reads into the room it
  // left (a lent buffer's room is seen by the next call: the budget holds more than two), so
  // every name was being read or read when its swap_in came. Each byte was read once.
  const nvio::SwapperStats after = swapper.stats();
  EXPECT_EQ(after.prefetch_hits - before.prefetch_hits, names.size());
  EXPECT_EQ(after.bytes_read - before.bytes_read, bytes);
  EXPECT_EQ(after.prefetch_queued, 0u);
  EXPECT_EQ(after.reads_in_flight, 0u);
  EXPECT_EQ(after.prefetched_bytes, 0u);
}

// Holds back the completions of reads of one file (by path) while closed: a drive that is slow
// for that file only (held_engine.hpp).
class ReadGate final : public CompletionGate {
 public:
  bool holds(const nvio::engine::Request& r) override {
    if (r.direction != nvio::engine::Direction::Read) return false;
    char target[4096];
    const std::string link = "/proc/self/fd/" + std::to_string(r.fd);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    std::lock_guard lock(mutex_);
    return n > 0 && !path_.empty() && std::string(target, static_cast<std::size_t>(n)) == path_;
  }
  void close(const std::string& p) {
    {
      std::lock_guard lock(mutex_);
      path_ = std::filesystem::canonical(p).string();
    }
    CompletionGate::close();
  }

 private:
  std::mutex mutex_;
  std::string path_;  // reads of this file are held
};

TEST(Swapper, ASwapInWaitsOnlyForItsOwnPrefetchRead) {
  const auto gate = std::make_shared<ReadGate>();
  ScopedEngineFactory factory(held_engine_factory(gate));
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(16 * MiB), handle_options());
  const std::vector<std::string> names = swap_out_many(swapper, 2, 1 * MiB);
  // The first name's reads never complete until the gate opens; the second is read behind it.
  gate->close(swapper.info(names[0])->path);
  ASSERT_EQ(swapper.prefetch(names), 2u);
  const std::size_t size = 1 * MiB + 4099;
  std::vector<unsigned char> out(size);
  // One read batch for both names would never finish here: the test process ends instead.
  run_within(std::chrono::seconds(60), "swap_in of a name read behind a held one",
             [&] { swapper.swap_in(names[1], out.data(), size, nvio::MemoryKind::Host); });
  EXPECT_TRUE(holds_pattern(out.data(), size, 501, names[1]));
  // The gate is not vacuous: the first name's requests reach it (whenever a worker submits them)
  // and its read stays in flight.
  run_within(std::chrono::seconds(60), "the held name's requests reaching the gate", [&] {
    while (gate->held.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(swapper.stats().reads_in_flight, 1u);
  gate->open();
  const auto first = swapper.swap_in(names[0]);
  EXPECT_TRUE(holds_pattern(first->data(), 1 * MiB, 500, names[0]));
  EXPECT_EQ(swapper.stats().prefetch_hits, 2u);
}

TEST(Swapper, QueuedNamesLeaveTheQueueOnEvictSwapOutSwapInAndClose) {
  TempDir dir;
  // Room for one of these at a time: while the caller keeps one lent, every prefetch queues.
  nvio::Swapper swapper(dir.path(), swapper_options(1 * MiB), handle_options());
  const std::size_t base = 700 * KiB;
  const std::vector<std::string> names = swap_out_many(swapper, 6, base);
  const auto size_of = [&](std::size_t i) { return base + i * 4099; };
  auto kept = swapper.swap_in(names[0]);
  ASSERT_EQ(swapper.prefetch(std::vector<std::string>(names.begin() + 1, names.end())), 5u);
  nvio::SwapperStats stats = swapper.stats();
  ASSERT_EQ(stats.prefetch_queued, 5u);
  ASSERT_EQ(stats.reads_in_flight, 0u);

  EXPECT_TRUE(swapper.evict(names[2]));
  EXPECT_EQ(swapper.stats().prefetch_queued, 4u);

  const auto replaced = pattern(5000, 77);  // small enough to be written beside `kept`
  swapper.wait(
      swapper.swap_out(names[3], replaced.data(), replaced.size(), nvio::MemoryKind::Host));
  EXPECT_EQ(swapper.stats().prefetch_queued, 3u);

  // A queued name swapped in straight into the caller's buffer (no pool memory, no copy).
  std::vector<unsigned char> out(size_of(4));
  swapper.swap_in(names[4], out.data(), out.size(), nvio::MemoryKind::Host);
  EXPECT_TRUE(holds_pattern(out.data(), out.size(), 504, names[4]));
  stats = swapper.stats();
  EXPECT_EQ(stats.prefetch_queued, 2u);
  EXPECT_EQ(stats.prefetch_hits, 0u);

  // Room again: a queued name swapped in to a lent buffer is read for it directly; the one still
  // queued (q5) does not fit beside that buffer.
  EXPECT_TRUE(holds_pattern(kept->data(), size_of(0), 500, names[0]));
  kept.reset();
  auto lent = swapper.swap_in(names[1]);
  EXPECT_TRUE(holds_pattern(lent->data(), size_of(1), 501, names[1]));
  stats = swapper.stats();
  EXPECT_EQ(stats.prefetch_queued, 1u);
  EXPECT_EQ(stats.reads_in_flight, 0u);
  EXPECT_EQ(stats.prefetch_hits, 0u);

  // The lent buffer destroyed, the next call finds the room and starts q5's read.
  lent.reset();
  const auto small = swapper.swap_in(names[3]);
  EXPECT_TRUE(holds_pattern(small->data(), replaced.size(), 77, names[3]));
  stats = swapper.stats();
  EXPECT_EQ(stats.prefetch_queued, 0u);
  EXPECT_EQ(stats.reads_in_flight, 1u);
  std::vector<unsigned char> out5(size_of(5));
  swapper.swap_in(names[5], out5.data(), out5.size(), nvio::MemoryKind::Host);
  EXPECT_TRUE(holds_pattern(out5.data(), out5.size(), 505, names[5]));
  EXPECT_EQ(swapper.stats().prefetch_hits, 1u);
  EXPECT_FALSE(swapper.contains(names[2]));

  // Closing with names queued reads none of them and removes every file.
  kept = swapper.swap_in(names[0]);
  ASSERT_EQ(swapper.prefetch(std::vector<std::string>{names[1], names[4], names[5]}), 3u);
  EXPECT_EQ(swapper.stats().prefetch_queued, 3u);
  swapper.close(true);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{});
  EXPECT_TRUE(holds_pattern(kept->data(), size_of(0), 500, names[0]));  // outlives the swapper
}

TEST(Swapper, ARequestLargerThanTheBudgetRaisesBudgetExceeded) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(1 * MiB), handle_options());
  const std::vector<unsigned char> big = pattern(1 * MiB + 1, 1);
  try {
    swapper.swap_out("big", big.data(), big.size(), nvio::MemoryKind::Host);
    FAIL() << "no BudgetExceeded";
  } catch (const nvio::BudgetExceeded& e) {
    EXPECT_EQ(e.needed(), 1 * MiB + 1);
    EXPECT_EQ(e.budget(), 1 * MiB);
    EXPECT_TRUE(contains(e.what(), "'big'"));
    EXPECT_TRUE(contains(e.what(), "1048577"));
  }
  EXPECT_FALSE(swapper.contains("big"));
}

TEST(Swapper, BuffersTheCallerKeepsRaiseInsteadOfWaitingForever) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(4 * MiB), handle_options());
  const std::size_t size = 1536 * KiB;
  std::vector<std::shared_ptr<nvio::SwapBuffer>> kept;
  for (int i = 0; i < 3; ++i) {
    const auto source = pattern(size, 10 + i);
    swapper.swap_out("t" + std::to_string(i), source.data(), size, nvio::MemoryKind::Host);
    swapper.wait();
  }
  kept.push_back(swapper.swap_in("t0"));
  kept.push_back(swapper.swap_in("t1"));
  EXPECT_THROW(swapper.swap_in("t2"), nvio::BudgetExceeded);
  kept.pop_back();  // freed: now it fits
  const auto in = swapper.swap_in("t2");
  EXPECT_TRUE(holds_pattern(in->data(), size, 12, "t2"));
}

TEST(Swapper, BudgetZeroIsRefused) {
  TempDir dir;
  EXPECT_THROW(nvio::Swapper(dir.path(), swapper_options(0), handle_options()),
               nvio::InvalidArgument);
}

// Flips one byte of `name`'s stored bytes with plain POSIX.
void corrupt(const nvio::Swapper& swapper, const std::string& name, std::uint64_t at) {
  const auto info = swapper.info(name);
  ASSERT_TRUE(info.has_value());
  const int fd = ::open(info->path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(info->offset + at)), 1);
  byte ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(info->offset + at)), 1);
  ::close(fd);
}

TEST(Swapper, ACorruptSwapFileRaisesChecksumMismatchNamingTensorFileAndOffset) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(16 * MiB), handle_options());
  for (const std::size_t size : {std::size_t{777}, std::size_t{3 * MiB + 3}}) {
    const std::string name = "w" + std::to_string(size);
    const auto source = pattern(size, size);
    swapper.swap_out(name, source.data(), size, nvio::MemoryKind::Host);
    swapper.wait();
    const auto intact = swapper.swap_in(name);
    ASSERT_TRUE(holds_pattern(intact->data(), size, size, name));
    corrupt(swapper, name, size / 2);
    const auto info = swapper.info(name);
    for (const bool prefetched : {false, true}) {
      if (prefetched) swapper.prefetch(std::vector<std::string>{name});
      try {
        swapper.swap_in(name);
        FAIL() << "no ChecksumMismatch for " << name;
      } catch (const nvio::ChecksumMismatch& e) {
        EXPECT_EQ(e.name(), name);
        EXPECT_EQ(e.path(), info->path);
        EXPECT_EQ(e.offset(), info->offset);
        EXPECT_EQ(e.length(), size);
        EXPECT_TRUE(contains(e.what(), name));
      }
    }
    std::vector<unsigned char> out(size);
    EXPECT_THROW(swapper.swap_in(name, out.data(), size, nvio::MemoryKind::Host),
                 nvio::ChecksumMismatch);
  }
}

TEST(Swapper, TwoLiveSwappersOnOneDirectoryRaiseDirectoryLocked) {
  TempDir dir;
  std::optional<nvio::Swapper> first;
  first.emplace(dir.path(), swapper_options(1 * MiB), handle_options());
  try {
    nvio::Swapper second(dir.path(), swapper_options(1 * MiB), handle_options());
    FAIL() << "no DirectoryLocked";
  } catch (const nvio::DirectoryLocked& e) {
    EXPECT_EQ(e.path(), dir.path());
    EXPECT_EQ(e.owner_pid(), ::getpid());
  }
  first.reset();
  const std::size_t warnings = recorded_warnings().size();
  nvio::Swapper again(dir.path(), swapper_options(1 * MiB), handle_options());
  EXPECT_EQ(recorded_warnings().size(), warnings);  // a clean close leaves nothing to report
}

TEST(Swapper, EvictingEverythingInAPackFileRemovesIt) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(8 * MiB), handle_options());
  for (int i = 0; i < 120; ++i) {  // 120 x ~20 KiB in 1 MiB pack files: three of them
    const auto source = pattern(20000 + i, i);
    swapper.swap_out("s" + std::to_string(i), source.data(), source.size(), nvio::MemoryKind::Host);
    swapper.wait();
  }
  const nvio::SwapperStats full = swapper.stats();
  EXPECT_GE(full.files, 3u);
  EXPECT_EQ(dir_entries(dir.path()).size(), full.files + 1);  // and the lock file
  for (int i = 0; i < 120; ++i) EXPECT_TRUE(swapper.evict("s" + std::to_string(i)));
  const nvio::SwapperStats empty = swapper.stats();
  EXPECT_EQ(empty.tensors, 0u);
  EXPECT_LE(empty.files, 1u);  // the pack being filled stays, to be filled again from its start
  EXPECT_EQ(empty.file_bytes, 0u);
  EXPECT_LE(dir_entries(dir.path()).size(), 2u);
}

TEST(Swapper, CloseRemovesEveryFile) {
  TempDir dir;
  nvio::Swapper swapper(dir.path(), swapper_options(8 * MiB), handle_options());
  for (int i = 0; i < 50; ++i) {
    const std::size_t size = i % 10 == 0 ? 600 * KiB : 100 + i;
    const auto source = pattern(size, i);
    swapper.swap_out("n" + std::to_string(i), source.data(), size, nvio::MemoryKind::Host);
    swapper.wait();
  }
  EXPECT_FALSE(dir_entries(dir.path()).empty());
  swapper.close(true);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{});
  EXPECT_THROW(swapper.swap_in("n1"), nvio::InvalidArgument);
}

TEST(Swapper, ADirectoryLeftByACrashedProcessIsCleanedWithAWarning) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  TempDir dir;
  const char mine[] = "not the swapper's";
  write_file(dir.file("mine.swap"), mine, sizeof(mine));  // only the swapper's own files go
  const int code = run_in_child([&] {
    nvio::Swapper swapper(dir.path(), swapper_options(8 * MiB), handle_options());
    for (int i = 0; i < 20; ++i) {
      const std::size_t size = i % 5 == 0 ? 400 * KiB : 1000 + i;
      const auto source = pattern(size, i);
      swapper.swap_out("n" + std::to_string(i), source.data(), size, nvio::MemoryKind::Host);
      swapper.wait();
    }
    ::kill(::getpid(), SIGKILL);
    return 0;
  });
  ASSERT_EQ(code, 128 + SIGKILL);
  const auto left = dir_entries(dir.path());
  ASSERT_GT(left.size(), 2u);  // the lock file, mine.swap and the swapper's files
  const std::size_t before = recorded_warnings().size();
  nvio::Swapper swapper(dir.path(), swapper_options(8 * MiB), handle_options());
  const auto warnings = recorded_warnings();
  ASSERT_EQ(warnings.size(), before + 1);
  EXPECT_TRUE(contains(warnings.back(), "removed " + std::to_string(left.size() - 2)));
  EXPECT_TRUE(contains(warnings.back(), "ended without closing"));
  EXPECT_TRUE(contains(warnings.back(), dir.path()));
  EXPECT_TRUE(swapper.names().empty());
  EXPECT_EQ(dir_entries(dir.path()), (std::vector<std::string>{"mine.swap", "nvio-swap.lock"}));
  EXPECT_EQ(read_file(dir.file("mine.swap")).size(), sizeof(mine));
}

TEST(Swapper, AForkedChildCannotUseNorRemoveItsParentsSwapper) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  TempDir dir;
  auto swapper =
      std::make_unique<nvio::Swapper>(dir.path(), swapper_options(8 * MiB), handle_options());
  const auto source = pattern(300 * KiB, 3);
  swapper->swap_out("a", source.data(), source.size(), nvio::MemoryKind::Host);
  swapper->wait();
  const auto before = dir_entries(dir.path());
  const int code = run_in_child([&] {
    try {
      swapper->swap_in("a");
      return 1;
    } catch (const nvio::InvalidArgument&) {
    }
    swapper->close(true);  // nothing of the parent's goes
    swapper.reset();       // nor at the child's end of it
    return 0;
  });
  ASSERT_EQ(code, 0);
  EXPECT_EQ(dir_entries(dir.path()), before);
  const auto in = swapper->swap_in("a");
  EXPECT_TRUE(holds_pattern(in->data(), in->size(), 3, "a"));
  EXPECT_THROW(nvio::Swapper(dir.path(), swapper_options(MiB), handle_options()),
               nvio::DirectoryLocked);  // still the parent's
}

TEST(Swapper, SnapshotRoundTrip) {
  TempDir dir;
  TempDir snap;
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> model;
  {
    // A budget of 3 MiB: staging buffers of 1 MiB, so the 2.5 MiB tensor is split over chunks.
    nvio::Swapper swapper(dir.path(), swapper_options(3 * MiB), handle_options());
    std::mt19937_64 rng(7);
    for (int i = 0; i < 200; ++i) {
      const std::size_t size = i == 0 ? 0 : i == 1 ? 2 * MiB + MiB / 2 + 1 : random_size(rng) / 4;
      const std::string name = "p" + std::to_string(i);
      const auto source = pattern(size, 500 + i);
      swapper.swap_out(name, source.data(), size, nvio::MemoryKind::Host, "meta " + name);
      swapper.wait();
      model[name] = {size, 500 + i};
    }
    swapper.snapshot(snap.path());
    EXPECT_THROW(swapper.snapshot(snap.path()), nvio::InvalidArgument);  // not over a snapshot
  }
  for (int open = 0; open < 2; ++open) {
    nvio::Swapper restored(snap.path(), swapper_options(8 * MiB), handle_options());
    ASSERT_EQ(restored.names().size(), model.size());
    for (const auto& [name, m] : model) {
      const auto info = restored.info(name);
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->meta, "meta " + name);
      EXPECT_TRUE(info->checksum.has_value());
      const auto in = restored.swap_in(name);
      ASSERT_EQ(in->size(), m.first);
      ASSERT_TRUE(holds_pattern(in->data(), m.first, m.second, name));
    }
    // Writes into a snapshot's directory go to new files; closing removes only those.
    const auto source = pattern(5000, 1);
    restored.swap_out("p3", source.data(), source.size(), nvio::MemoryKind::Host);
    restored.wait();
    restored.close(true);
    EXPECT_EQ(dir_entries(snap.path()), (std::vector<std::string>{"data.swap", "nvio-swap.json"}));
  }
}

// On XFS with reflink, a snapshot shares the swap files' whole blocks instead of copying them:
// the counter says so, and the snapshot keeps its bytes after the swapper rewrites every tensor
// (copy on write), partly cloned tensors (a tail below a block) included.
TEST(Swapper, SnapshotClonesBlocksWhereTheFileSystemSharesThem) {
  std::string why;
  auto fs = LoopMount::make("/dev/shm", 320 * MiB, &why, LoopFs::XfsReflink);
  if (!fs) GTEST_SKIP() << "no XFS loop mount with reflink (xfsprogs, root): " << why;
  const std::string dir = fs->file("swap");
  const std::string snap = fs->file("snap");
  const std::vector<std::size_t> sizes{2 * MiB + 1, 3 * 4096 + 100, 4096, 5000, 17, 700 * KiB};
  std::uint64_t whole_blocks = 0;
  for (std::size_t size : sizes) whole_blocks += size / 4096 * 4096;
  {
    nvio::Swapper swapper(dir, swapper_options(8 * MiB), handle_options());
    std::vector<std::vector<unsigned char>> sources;  // alive until the writes behind finish
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      sources.push_back(pattern(sizes[i], 10 + i));
      swapper.swap_out("t" + std::to_string(i), sources.back().data(), sizes[i],
                       nvio::MemoryKind::Host);
    }
    swapper.wait();
    swapper.snapshot(snap);
    // Every tensor of a page or more starts on a page in its swap file and in the snapshot.
    EXPECT_EQ(swapper.stats().bytes_cloned, whole_blocks);
    for (std::size_t i = 0; i < sizes.size(); ++i) {  // rewritten in place, or elsewhere
      sources[i] = pattern(sizes[i], 90 + i);
      swapper.swap_out("t" + std::to_string(i), sources[i].data(), sizes[i],
                       nvio::MemoryKind::Host);
    }
    swapper.wait();
  }
  nvio::Swapper restored(snap, swapper_options(8 * MiB), handle_options());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    const auto in = restored.swap_in(name);  // checksums verified on the way
    ASSERT_EQ(in->size(), sizes[i]);
    EXPECT_TRUE(holds_pattern(in->data(), sizes[i], 10 + i, name));
  }
}

// Where the snapshot copies the tensor, the copy checks it: the snapshot raises and leaves
// nothing. Where the file system shares blocks (XFS, btrfs), the snapshot clones them unread, as
// documented, and the corruption is found when the snapshot's tensor is read back.
TEST(Swapper, SnapshotOfACorruptTensorRaisesAndLeavesNoSnapshot) {
  TempDir dir;
  TempDir snap;
  nvio::Swapper swapper(dir.path(), swapper_options(3 * MiB), handle_options());
  const auto source = pattern(2 * MiB + 3, 9);
  swapper.swap_out("big", source.data(), source.size(), nvio::MemoryKind::Host);
  swapper.wait();
  corrupt(swapper, "big", 2 * MiB);
  bool raised = false;
  try {
    swapper.snapshot(snap.path());
  } catch (const nvio::ChecksumMismatch&) {
    raised = true;
  }
  if (swapper.stats().bytes_cloned == 0) {
    EXPECT_TRUE(raised) << "a copied snapshot did not check the tensor";
    EXPECT_EQ(dir_entries(snap.path()), std::vector<std::string>{});
    return;
  }
  EXPECT_FALSE(raised);
  nvio::Swapper restored(snap.path(), swapper_options(8 * MiB), handle_options());
  EXPECT_THROW(restored.swap_in("big"), nvio::ChecksumMismatch);
}

TEST(Swapper, CloseKeepingFilesMakesADirectoryThatOpensAgain) {
  TempDir dir;
  {
    nvio::Swapper swapper(dir.path(), swapper_options(4 * MiB), handle_options());
    for (int i = 0; i < 30; ++i) {
      const std::size_t size = 1 + i * 9000;
      const auto source = pattern(size, 40 + i);
      swapper.swap_out("k" + std::to_string(i), source.data(), size, nvio::MemoryKind::Host);
      swapper.wait();  // before `source` goes
    }
    swapper.close(false);
  }
  const std::size_t warnings = recorded_warnings().size();
  nvio::Swapper swapper(dir.path(), swapper_options(4 * MiB), handle_options());
  EXPECT_EQ(recorded_warnings().size(), warnings);
  for (int i = 0; i < 30; ++i) {
    const std::size_t size = 1 + i * 9000;
    std::vector<unsigned char> out(size);
    swapper.swap_in("k" + std::to_string(i), out.data(), size, nvio::MemoryKind::Host);
    ASSERT_TRUE(holds_pattern(out.data(), size, 40 + i, "k" + std::to_string(i)));
  }
}

}  // namespace
}  // namespace swapper
}  // namespace nvio_test
