#include "operators/step_window.h"

#include <gtest/gtest.h>

#include "operators/phase_stats.h"
#include "operators/test_support.h"

namespace rankwatch {
namespace {

using testing::Sample;

AlignedStep Step(uint64_t step, std::vector<StepSample> samples) {
  AlignedStep a;
  a.step = step;
  a.world_size = 3;
  a.samples = std::move(samples);
  return a;
}

TEST(StepWindowTest, KeepsTheLastKStepsAndTheirSums) {
  StepWindow w(3, {.steps = 2});
  w.Add(Step(0, {Sample(0, 0, 100), Sample(1, 0, 10), Sample(2, 0, 10)}));
  w.Add(Step(1, {Sample(0, 1, 20), Sample(1, 1, 10), Sample(2, 1, 10)}));
  w.Add(Step(2, {Sample(0, 2, 40), Sample(1, 2, 10), Sample(2, 2, 10)}));
  EXPECT_EQ(w.size(), 2u);
  EXPECT_EQ(w.first_step(), 1u);
  EXPECT_EQ(w.last_step(), 2u);
  const auto& t = w.totals()[0];
  EXPECT_EQ(t.sum_ns[static_cast<int>(Phase::kDataloader)], 60'000'000);  // 20 + 40 ms
  EXPECT_EQ(t.count[static_cast<int>(Phase::kDataloader)], 2u);
}

TEST(PhaseStatsTest, MedianWorstSkewOfPerRankMeans) {
  StepWindow w(3, {.steps = 10});
  for (uint64_t s = 0; s < 4; ++s) {
    w.Add(Step(s, {Sample(0, s, 10), Sample(1, s, 12), Sample(2, s, 30)}));
  }
  const PhaseStats stats = ComputePhaseStats(w);
  const PhaseStat& dl = stats[static_cast<int>(Phase::kDataloader)];
  ASSERT_TRUE(dl.present);
  EXPECT_NEAR(dl.median_seconds, 0.012, 1e-12);
  EXPECT_NEAR(dl.worst_seconds, 0.030, 1e-12);
  EXPECT_EQ(dl.worst_rank, 2u);
  EXPECT_NEAR(dl.skew, 1.5, 1e-9);
  // wait = step - (dl + fwd + bwd + opt) = 2 ms for every rank.
  EXPECT_NEAR(stats[static_cast<int>(Phase::kWait)].median_seconds, 0.002, 1e-12);
  EXPECT_FALSE(stats[static_cast<int>(Phase::kCollective)].present);
}

TEST(PhaseStatsTest, RanksMissingFromTimedOutStepsUseTheirOwnCount) {
  StepWindow w(3, {.steps = 10});
  w.Add(Step(0, {Sample(0, 0, 10), Sample(1, 0, 10), Sample(2, 0, 10)}));
  w.Add(Step(1, {Sample(0, 1, 10), Sample(1, 1, 10)}));  // rank 2 missing
  const PhaseStats stats = ComputePhaseStats(w);
  const PhaseStat& dl = stats[static_cast<int>(Phase::kDataloader)];
  EXPECT_NEAR(dl.worst_seconds, 0.010, 1e-12);
  EXPECT_EQ(dl.skew, 0.0);
  EXPECT_EQ(w.last_ranks_present(), 2u);
}

TEST(PhaseStatsTest, OneRankMedianIsWorst) {
  StepWindow w(1, {.steps = 10});
  AlignedStep a = Step(0, {Sample(0, 0, 25)});
  w.Add(a);
  const PhaseStats stats = ComputePhaseStats(w);
  const PhaseStat& dl = stats[static_cast<int>(Phase::kDataloader)];
  EXPECT_EQ(dl.median_seconds, dl.worst_seconds);
  EXPECT_EQ(dl.skew, 0.0);
}

TEST(MedianTest, EvenCountAveragesTheMiddle) {
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(MedianInPlace(v), 2.5);
  std::vector<double> odd = {5, 1, 3};
  EXPECT_DOUBLE_EQ(MedianInPlace(odd), 3);
}

}  // namespace
}  // namespace rankwatch
