#include "operators/step_aligner.h"

#include <gtest/gtest.h>

#include "operators/test_support.h"

namespace rankwatch {
namespace {

using testing::Sample;

const TimePoint t0{};
constexpr auto kTimeout = std::chrono::seconds(10);

StepAligner Make(uint32_t world, size_t max_pending = 256) {
  return StepAligner(world, {kTimeout, max_pending});
}

TEST(StepAlignerTest, ClosesAStepWhenEveryRankReported) {
  StepAligner a = Make(3);
  std::vector<AlignedStep> closed;
  EXPECT_EQ(a.Add(Sample(0, 7), t0, &closed), AlignOutcome::kAccepted);
  EXPECT_EQ(a.Add(Sample(2, 7), t0, &closed), AlignOutcome::kAccepted);
  EXPECT_TRUE(closed.empty());
  EXPECT_EQ(a.Add(Sample(1, 7), t0, &closed), AlignOutcome::kAccepted);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].step, 7u);
  EXPECT_FALSE(closed[0].timed_out);
  ASSERT_EQ(closed[0].samples.size(), 3u);
  for (uint32_t r = 0; r < 3; ++r) EXPECT_EQ(closed[0].samples[r].rank, r);
  EXPECT_EQ(a.pending_steps(), 0u);
}

TEST(StepAlignerTest, StepsCloseInOrderEvenWhenALaterOneCompletesFirst) {
  StepAligner a = Make(2);
  std::vector<AlignedStep> closed;
  a.Add(Sample(0, 1), t0, &closed);
  a.Add(Sample(0, 2), t0, &closed);
  a.Add(Sample(1, 2), t0, &closed);  // step 2 complete, but step 1 still waits for rank 1
  EXPECT_TRUE(closed.empty());
  a.Add(Sample(1, 1), t0, &closed);
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].step, 1u);
  EXPECT_EQ(closed[1].step, 2u);
}

TEST(StepAlignerTest, TimeoutClosesWithThePresentRanks) {
  StepAligner a = Make(4);
  std::vector<AlignedStep> closed;
  a.Add(Sample(0, 5), t0, &closed);
  a.Add(Sample(3, 5), t0 + std::chrono::seconds(3), &closed);
  a.Expire(t0 + std::chrono::seconds(9), &closed);
  EXPECT_TRUE(closed.empty());
  a.Expire(t0 + kTimeout, &closed);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_TRUE(closed[0].timed_out);
  ASSERT_EQ(closed[0].samples.size(), 2u);
  EXPECT_EQ(closed[0].samples[0].rank, 0u);
  EXPECT_EQ(closed[0].samples[1].rank, 3u);
}

TEST(StepAlignerTest, DuplicatesAndLateRecordsAreCountedNotAligned) {
  StepAligner a = Make(2);
  std::vector<AlignedStep> closed;
  a.Add(Sample(0, 1), t0, &closed);
  EXPECT_EQ(a.Add(Sample(0, 1), t0, &closed), AlignOutcome::kDuplicate);  // pending duplicate
  a.Expire(t0 + kTimeout, &closed);  // step 1 closes without rank 1
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(a.Add(Sample(1, 1), t0 + kTimeout, &closed), AlignOutcome::kLate);
  EXPECT_EQ(a.Add(Sample(0, 1), t0 + kTimeout, &closed), AlignOutcome::kDuplicate);
  EXPECT_EQ(a.Add(Sample(5, 2), t0, &closed), AlignOutcome::kRankOutOfRange);
  EXPECT_EQ(closed.size(), 1u);
}

TEST(StepAlignerTest, PendingStepsAreBounded) {
  StepAligner a = Make(2, /*max_pending=*/4);
  std::vector<AlignedStep> closed;
  for (uint64_t s = 0; s < 10; ++s) a.Add(Sample(0, s), t0, &closed);  // rank 1 silent
  EXPECT_EQ(a.pending_steps(), 4u);
  ASSERT_EQ(closed.size(), 6u);
  EXPECT_EQ(closed.front().step, 0u);
  EXPECT_TRUE(closed.front().timed_out);
  EXPECT_EQ(a.last_closed_step(), 5u);
}

TEST(StepAlignerTest, TracksRanksSeenAndLastStep) {
  StepAligner a = Make(3);
  std::vector<AlignedStep> closed;
  a.Add(Sample(1, 4), t0, &closed);
  a.Add(Sample(1, 5), t0, &closed);
  EXPECT_EQ(a.ranks_seen(), 1u);
  EXPECT_EQ(a.last_step_of(1), 5);
  EXPECT_EQ(a.last_step_of(0), -1);
}

}  // namespace
}  // namespace rankwatch
