#include "collectors/lib/bounded_ring.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace rankwatch {
namespace {

TEST(BoundedRingTest, FifoUpToCapacityThenFull) {
  BoundedRing<int> ring(4);
  EXPECT_EQ(ring.capacity(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ring.TryPush(i));
  EXPECT_FALSE(ring.TryPush(99));
  int v = -1;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(ring.TryPop(&v));
    EXPECT_EQ(v, i);
  }
  EXPECT_FALSE(ring.TryPop(&v));
}

TEST(BoundedRingTest, CapacityRoundsUpToPowerOfTwo) {
  BoundedRing<int> ring(5);
  EXPECT_EQ(ring.capacity(), 8u);
}

TEST(BoundedRingTest, DropOldestKeepsTheNewestAndCounts) {
  BoundedRing<int> ring(4);
  for (int i = 0; i < 10; ++i) ring.PushDropOldest(i);
  EXPECT_EQ(ring.dropped(), 6u);
  EXPECT_EQ(ring.size(), 4u);
  int v = -1;
  for (int want = 6; want < 10; ++want) {
    ASSERT_TRUE(ring.TryPop(&v));
    EXPECT_EQ(v, want);
  }
}

TEST(BoundedRingTest, ConcurrentProducersLoseNothingWhenDrained) {
  BoundedRing<uint64_t> ring(1024);
  constexpr int kProducers = 3, kPerProducer = 20000;
  std::atomic<bool> done{false};
  uint64_t popped = 0, sum = 0;
  std::thread consumer([&] {
    uint64_t v;
    while (!done.load() || ring.size() > 0) {
      while (ring.TryPop(&v)) {
        ++popped;
        sum += v;
      }
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&ring] {
      for (int i = 1; i <= kPerProducer; ++i) {
        while (!ring.TryPush(i)) std::this_thread::yield();
      }
    });
  }
  for (auto& t : producers) t.join();
  done = true;
  consumer.join();
  EXPECT_EQ(popped, uint64_t{kProducers} * kPerProducer);
  EXPECT_EQ(sum, uint64_t{kProducers} * kPerProducer * (kPerProducer + 1) / 2);
}

TEST(BoundedRingTest, ConcurrentDropOldestAccountsForEveryElement) {
  BoundedRing<uint64_t> ring(64);
  constexpr int kProducers = 2, kPerProducer = 50000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&ring] {
      for (int i = 0; i < kPerProducer; ++i) ring.PushDropOldest(i);
    });
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(ring.size() + ring.dropped(), uint64_t{kProducers} * kPerProducer);
  EXPECT_EQ(ring.size(), 64u);
}

}  // namespace
}  // namespace rankwatch
