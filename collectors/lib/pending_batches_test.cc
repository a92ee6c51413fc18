#include "collectors/lib/pending_batches.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

PendingBatch Batch(char tag, size_t bytes, uint64_t records) {
  return PendingBatch{std::string(bytes, tag), records};
}

TEST(PendingBatchesTest, KeepsBatchesInOrderUnderTheBound) {
  PendingBatches p(100);
  EXPECT_EQ(p.Push(Batch('a', 40, 4)), 0u);
  EXPECT_EQ(p.Push(Batch('b', 40, 4)), 0u);
  EXPECT_EQ(p.bytes(), 80u);
  EXPECT_EQ(p.front().payload[0], 'a');
  p.PopFront();
  EXPECT_EQ(p.front().payload[0], 'b');
  EXPECT_EQ(p.bytes(), 40u);
}

TEST(PendingBatchesTest, DropsTheOldestOverTheBoundAndCountsRecords) {
  PendingBatches p(100);
  p.Push(Batch('a', 40, 3));
  p.Push(Batch('b', 40, 5));
  EXPECT_EQ(p.Push(Batch('c', 40, 7)), 3u);  // 120 > 100: 'a' goes
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.front().payload[0], 'b');
  EXPECT_EQ(p.dropped_batches(), 1u);
  EXPECT_EQ(p.dropped_records(), 3u);
  EXPECT_LE(p.bytes(), 100u);
}

TEST(PendingBatchesTest, AnOversizedBatchIsKeptAlone) {
  PendingBatches p(100);
  p.Push(Batch('a', 10, 1));
  EXPECT_EQ(p.Push(Batch('b', 500, 9)), 1u);
  EXPECT_EQ(p.size(), 1u);
  EXPECT_EQ(p.front().payload[0], 'b');
}

}  // namespace
}  // namespace rankwatch
