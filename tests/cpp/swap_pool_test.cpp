// The swapper's memory pool (src/jobs/swap_pool.hpp): medium buffers in huge-page slabs, the
// fallback to a mapping of their own, slot reuse, and that making room drops only the free memory
// it needs.
#include "jobs/swap_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using nvio::detail::SwapPool;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

std::shared_ptr<SwapPool> make_pool(std::uint64_t budget) {
  return std::make_shared<SwapPool>(budget, nvio::LockMode::None);
}

std::uintptr_t address(const std::shared_ptr<nvio::SwapBuffer>& b) {
  return reinterpret_cast<std::uintptr_t>(b->data());
}

TEST(SwapPool, MediumBuffersShareAHugePageSlab) {
  auto pool = make_pool(64 * kMiB);
  auto a = pool->try_allocate(kMiB);
  auto b = pool->try_allocate(kMiB);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool->mapped(), 2 * kMiB) << "two 1 MiB slots of one 2 MiB slab";
  const std::uintptr_t lo = std::min(address(a), address(b));
  EXPECT_EQ(lo % (2 * kMiB), 0u) << "the slab starts on a huge page";
  EXPECT_EQ(std::max(address(a), address(b)) - lo, kMiB);
  // The slots do not overlap: each keeps its own bytes.
  std::memset(a->data(), 0x11, kMiB);
  std::memset(b->data(), 0x22, kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(a->data())[kMiB - 1], 0x11);
  EXPECT_EQ(static_cast<unsigned char*>(b->data())[0], 0x22);
  EXPECT_TRUE(pool->owns(a->data(), kMiB));
  EXPECT_FALSE(pool->owns(static_cast<char*>(a->data()) + 1, kMiB)) << "past the lent size";
}

TEST(SwapPool, MediumSlotsWasteAtMostAnEighth) {
  auto pool = make_pool(64 * kMiB);
  // 1 MiB + 1 byte takes a slot of 1.125 MiB; five of them fill a slab of three huge pages.
  auto a = pool->try_allocate(kMiB + 1);
  auto b = pool->try_allocate(kMiB + 1);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), kMiB + 1);
  EXPECT_EQ(pool->mapped(), 6 * kMiB);
  EXPECT_EQ(address(a) > address(b) ? address(a) - address(b) : address(b) - address(a),
            kMiB + kMiB / 8);
  // 300 KiB: a slot of 320 KiB, six of them in one huge page.
  auto c = pool->try_allocate(300 * 1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(pool->mapped(), 8 * kMiB);
  // 200 KiB is not medium: a mapping of its own.
  auto d = pool->try_allocate(200 * 1024);
  ASSERT_TRUE(d);
  EXPECT_EQ(pool->mapped(), 8 * kMiB + 200 * 1024);
}

TEST(SwapPool, AFreedSlotIsReusedWithoutMapping) {
  auto pool = make_pool(8 * kMiB);
  auto a = pool->try_allocate(700 * 1024);
  ASSERT_TRUE(a);
  const std::uintptr_t at = address(a);
  const std::uint64_t mapped = pool->mapped();
  a.reset();
  EXPECT_EQ(pool->free_bytes(), mapped) << "an empty slab is kept for reuse";
  auto b = pool->try_allocate(700 * 1024);
  ASSERT_TRUE(b);
  EXPECT_EQ(address(b), at);
  EXPECT_EQ(pool->mapped(), mapped);
  EXPECT_EQ(pool->free_bytes(), 0u);
}

TEST(SwapPool, MediumBufferWithoutRoomForASlabGetsItsOwnMapping) {
  auto pool = make_pool(3 * kMiB);
  auto a = pool->try_allocate(kMiB);
  ASSERT_TRUE(a) << "1 MiB fits a budget of 3 MiB, which has no room for its slab twice over";
  EXPECT_EQ(pool->mapped(), kMiB);
  EXPECT_EQ(pool->held(), kMiB);
  auto b = pool->try_allocate(kMiB);
  ASSERT_TRUE(b);
  EXPECT_EQ(pool->mapped(), 2 * kMiB);
  EXPECT_FALSE(pool->try_allocate(2 * kMiB)) << "past the budget";
}

TEST(SwapPool, SlabsInUseLeaveAtMostAnEighthOfTheBudgetIdle) {
  // Budget 32 MiB: slots of slabs in use that nobody uses may take at most 4 MiB of it.
  auto pool = make_pool(32 * kMiB);
  auto a = pool->try_allocate(300 * 1024);  // a 320 KiB slot: 1.6875 MiB of its slab idle
  auto b = pool->try_allocate(kMiB);        // 1 MiB idle more
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool->mapped(), 4 * kMiB);
  // A 640 KiB slot's slab would leave 1.375 MiB more idle, 4.0625 MiB in all: a mapping of its
  // own instead, though the budget has room for the slab twice over.
  auto c = pool->try_allocate(600 * 1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(pool->mapped(), 4 * kMiB + 600 * 1024);
  // Slots of the slabs there are still serve.
  auto d = pool->try_allocate(kMiB);
  ASSERT_TRUE(d);
  EXPECT_EQ(pool->mapped(), 4 * kMiB + 600 * 1024);
  // Once the 320 KiB slot is returned its slab is empty (free, dropped when room is needed), no
  // longer idle in use: the 640 KiB class gets a slab.
  a.reset();
  auto e = pool->try_allocate(600 * 1024);
  ASSERT_TRUE(e);
  EXPECT_EQ(pool->mapped(), 6 * kMiB + 600 * 1024);
}

TEST(SwapPool, WithoutABudgetKeepFreeBoundsTheIdleSlotsOfSlabsInUse) {
  // The binding's pool for locked tensors: no budget to speak of, keep_free 4 MiB.
  auto pool = std::make_shared<SwapPool>(std::numeric_limits<std::uint64_t>::max(),
                                         nvio::LockMode::None, 4 * kMiB);
  auto a = pool->try_allocate(300 * 1024);  // a slab: 1.6875 MiB of it idle
  auto b = pool->try_allocate(600 * 1024);  // a slab: 1.375 MiB more, 3.0625 MiB
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool->mapped(), 4 * kMiB);
  // 1 MiB + 1: a 1.125 MiB slot of a 6 MiB slab would leave 4.875 MiB more idle: its own mapping.
  auto c = pool->try_allocate(kMiB + 1);
  ASSERT_TRUE(c);
  EXPECT_EQ(pool->mapped(), 4 * kMiB + kMiB + 4096);
}

TEST(SwapPool, MakingRoomDropsOnlyWhatItNeeds) {
  auto pool = make_pool(12 * kMiB);
  {
    std::vector<std::shared_ptr<nvio::SwapBuffer>> held;
    for (int i = 0; i < 3; ++i) held.push_back(pool->try_allocate(4 * kMiB));
    for (const auto& b : held) ASSERT_TRUE(b);
  }
  EXPECT_EQ(pool->free_bytes(), 12 * kMiB);
  EXPECT_FALSE(pool->try_charge(13 * kMiB));
  EXPECT_EQ(pool->mapped(), 12 * kMiB) << "nothing is dropped for what can never fit";
  ASSERT_TRUE(pool->try_charge(4 * kMiB));
  EXPECT_EQ(pool->mapped(), 8 * kMiB) << "one free buffer dropped, two kept warm";
  EXPECT_EQ(pool->free_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->held(), 12 * kMiB);
  auto reused = pool->try_allocate(4 * kMiB);
  ASSERT_TRUE(reused);
  EXPECT_EQ(pool->mapped(), 8 * kMiB) << "a kept buffer, not a new mapping";
  pool->uncharge(4 * kMiB);
}

TEST(SwapPool, KeepsNoMoreFreeMemoryThanAsked) {
  // No budget to speak of, as the binding's pool for locked tensors: what returns beyond
  // keep_free is unmapped at once, so the pool does not hold its peak for ever.
  auto pool = std::make_shared<SwapPool>(std::numeric_limits<std::uint64_t>::max(),
                                         nvio::LockMode::None, 2 * kMiB);
  std::vector<std::shared_ptr<nvio::SwapBuffer>> held;
  for (int i = 0; i < 8; ++i) held.push_back(pool->try_allocate(kMiB));  // four 2 MiB slabs
  for (const auto& b : held) ASSERT_TRUE(b);
  EXPECT_EQ(pool->mapped(), 8 * kMiB);
  held.resize(2);  // slabs 2-4 empty: one kept, two unmapped
  EXPECT_EQ(pool->free_bytes(), 2 * kMiB);
  EXPECT_EQ(pool->mapped(), 4 * kMiB);
  auto big = pool->try_allocate(3 * kMiB);  // a mapping of its own, 4 MiB
  ASSERT_TRUE(big);
  big.reset();  // 6 MiB free: the largest goes first
  EXPECT_EQ(pool->free_bytes(), 2 * kMiB);
  EXPECT_EQ(pool->mapped(), 4 * kMiB);
  held.clear();
  EXPECT_EQ(pool->free_bytes(), 2 * kMiB);
  EXPECT_EQ(pool->mapped(), 2 * kMiB);
}

TEST(SwapPool, ThreadsAllocatingAndReleasingStayInTheBudget) {
  // Four threads take and return buffers of every kind (small slots, medium slots, mappings of
  // their own) under a budget that forces slabs to be dropped and mapped again, while slabs are
  // mapped outside the lock. Every buffer keeps its own bytes, and the budget holds throughout.
  constexpr std::uint64_t kBudget = 24 * kMiB;
  auto pool = std::make_shared<SwapPool>(kBudget, nvio::LockMode::None, 8 * kMiB);
  std::atomic<bool> over{false};
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      const std::size_t sizes[] = {100, 2048, 300 << 10, kMiB, kMiB + 4096, 3 * kMiB / 2, 3 * kMiB};
      std::vector<std::pair<std::shared_ptr<nvio::SwapBuffer>, unsigned char>> held;
      for (int i = 0; i < 400; ++i) {
        if (held.size() < 4 && rng() % 2 == 0) {
          const std::size_t size = sizes[rng() % std::size(sizes)];
          if (auto b = pool->try_allocate(size)) {
            const auto tag = static_cast<unsigned char>(rng());
            std::memset(b->data(), tag, size);
            held.emplace_back(std::move(b), tag);
          }
        } else if (!held.empty()) {
          auto& [b, tag] = held.back();
          const auto* p = static_cast<const unsigned char*>(b->data());
          if (p[0] != tag || p[b->size() - 1] != tag || p[b->size() / 2] != tag) ++corrupt;
          held.pop_back();
        }
        if (pool->held() > kBudget) over = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(over);
  EXPECT_EQ(corrupt.load(), 0) << "two buffers shared memory";
  EXPECT_LE(pool->free_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->free_bytes(), pool->mapped()) << "everything returned";
}

}  // namespace

// issue 28 #8: a size within a huge page of 2^64 (a swap index's `size` of 2^64 - 1) rounded to
// whole pages wrapped to 0, which the budget then took as nothing to allocate.
TEST(SwapPool, FootprintOfAnAbsurdSizeNeverWraps) {
  constexpr auto kMost = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(SwapPool::footprint(static_cast<std::size_t>(kMost)), kMost);
  EXPECT_EQ(SwapPool::footprint(static_cast<std::size_t>(kMost - kMiB)), kMost);
  EXPECT_EQ(SwapPool::footprint(static_cast<std::size_t>(3 * kMiB)), 4 * kMiB);
  auto pool = make_pool(64 * kMiB);
  EXPECT_EQ(pool->try_allocate(static_cast<std::size_t>(kMost)), nullptr);
}
