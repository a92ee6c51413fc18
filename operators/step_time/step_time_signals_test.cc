#include "operators/step_time/signals.h"

#include <gtest/gtest.h>

#include "operators/step_time/test_windows.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

constexpr int kDl = PhaseIndex(Phase::kDataloader);
constexpr int kOpt = PhaseIndex(Phase::kOptimizer);
constexpr int kColl = PhaseIndex(Phase::kCollective);

TEST(EvidenceOfTest, MedianWorstSkewAndTheRanksAboveTheMedianLargestFirst) {
  const SignalEvidence e = EvidenceOf({1, NAN, 5, 3, 4, 10});
  EXPECT_TRUE(e.stat.present);
  EXPECT_EQ(e.stat.ranks, 5u);
  EXPECT_DOUBLE_EQ(e.stat.median_seconds, 4);
  EXPECT_DOUBLE_EQ(e.stat.worst_seconds, 10);
  EXPECT_EQ(e.stat.worst_rank, 5u);
  EXPECT_DOUBLE_EQ(e.stat.skew, 1.5);
  ASSERT_EQ(e.top.size(), 2u);
  EXPECT_EQ(e.top[0].rank, 5u);
  EXPECT_DOUBLE_EQ(e.top[0].excess_seconds, 6);
  EXPECT_EQ(e.top[1].rank, 2u);
  EXPECT_DOUBLE_EQ(e.top[1].excess_seconds, 1);
}

TEST(EvidenceOfTest, KeepsTheTopThreeAndTheLowestWorstRankOnATie) {
  const SignalEvidence e = EvidenceOf({9, 1, 1, 1, 1, 7, 9, 8, 1});
  EXPECT_EQ(e.stat.worst_rank, 0u);
  ASSERT_EQ(e.top.size(), 3u);
  EXPECT_DOUBLE_EQ(e.top[0].excess_seconds, 8);
  EXPECT_DOUBLE_EQ(e.top[1].excess_seconds, 8);
  EXPECT_EQ(e.top[2].rank, 7u);
}

TEST(EvidenceOfTest, OneRankIsItsOwnMedianWithoutSkewAndNoneIsAbsent) {
  const SignalEvidence one = EvidenceOf({NAN, 0.25});
  EXPECT_TRUE(one.stat.present);
  EXPECT_DOUBLE_EQ(one.stat.median_seconds, 0.25);
  EXPECT_EQ(one.stat.worst_rank, 1u);
  EXPECT_EQ(one.stat.skew, 0);
  EXPECT_TRUE(one.top.empty());
  EXPECT_FALSE(EvidenceOf({NAN, NAN}).stat.present);
}

TEST(MeasureWindowTest, MeansEveryPhaseOfEachRankOverEveryStepOfTheWindow) {
  // Rank r fetches for 5 + r ms; the optimizer runs (8 ms) on every 4th step: 1.6 ms a step
  // over 10 steps.
  const StepWindow w = WindowOf(3, 10, [](uint64_t s, uint32_t r) {
    Ms m{.dl = 5.0 + r, .fwd = 20, .bwd = 20, .step = 50};
    if (s % 4 == 3) m.opt = 8;
    return m;
  });
  const WindowSignals s = MeasureWindow(w);
  ASSERT_EQ(s.present.size(), 3u);
  EXPECT_NEAR(s.phase[kOpt][1], 0.0016, 1e-12);
  EXPECT_NEAR(s.phase[kDl][2], 0.007, 1e-12);
  EXPECT_TRUE(std::isnan(s.phase[kColl][0]));
  EXPECT_EQ(s.present[0], PhaseBit(Phase::kDataloader) | PhaseBit(Phase::kForward) |
                              PhaseBit(Phase::kBackward) | PhaseBit(Phase::kOptimizer) |
                              PhaseBit(Phase::kWait) | PhaseBit(Phase::kStep));
  EXPECT_NEAR(s.Median(Phase::kDataloader), 0.006, 1e-12);
  EXPECT_EQ(s.evidence[kDl].stat.worst_rank, 2u);
  EXPECT_EQ(s.Median(Phase::kCollective), 0);
  EXPECT_NEAR(s.step().median_seconds, 0.050, 1e-12);
  EXPECT_TRUE(s.missing.empty());
  EXPECT_TRUE(s.ComputeConsistent());
}

TEST(MissingSignalsTest, NamesSilentRanksAndThePhasesSomeRanksDoNotReport) {
  // Rank 3 is silent; rank 1 has no optimizer; rank 2 times forward and backward as one.
  const StepWindow w = WindowOf(4, 10, [](uint64_t, uint32_t r) {
    if (r == 3) return Ms{};
    Ms m{.dl = 5, .fwd = 20, .bwd = 20, .opt = 5, .step = 52};
    if (r == 1) m.opt = -1;
    if (r == 2) m.fwd = m.bwd = -1, m.fb = 40;
    return m;
  });
  const WindowSignals s = MeasureWindow(w);
  ASSERT_EQ(s.missing.size(), 2u);
  EXPECT_EQ(s.missing[0].phase, Phase::kStep);
  EXPECT_EQ(s.missing[0].reporting, 3u);
  EXPECT_EQ(s.missing[0].ranks, 4u);
  EXPECT_EQ(s.missing[0].missing_ranks, std::vector<uint32_t>{3});
  EXPECT_EQ(s.missing[1].phase, Phase::kOptimizer);
  EXPECT_EQ(s.missing[1].reporting, 2u);
  EXPECT_EQ(s.missing[1].ranks, 3u);
  EXPECT_EQ(s.missing[1].missing_ranks, std::vector<uint32_t>{1});
  EXPECT_TRUE(s.IsMissing(Phase::kOptimizer));
  EXPECT_FALSE(s.IsMissing(Phase::kForward));
  EXPECT_FALSE(s.ComputeConsistent());  // rank 1's compute would look 5 ms shorter
}

TEST(MissingSignalsTest, APhaseNoRankReportsKeepsComputeComparable) {
  const StepWindow w = WindowOf(
      2, 10, [](uint64_t, uint32_t) { return Ms{.dl = 5, .fwd = 20, .bwd = 20, .step = 50}; });
  const WindowSignals s = MeasureWindow(w);
  ASSERT_EQ(s.missing.size(), 1u);
  EXPECT_EQ(s.missing[0].phase, Phase::kOptimizer);
  EXPECT_EQ(s.missing[0].reporting, 0u);
  EXPECT_TRUE(s.ComputeConsistent());
}

TEST(MissingSignalsTest, ListsAtMostSixteenRanks) {
  const StepWindow w = WindowOf(40, 10, [](uint64_t, uint32_t r) {
    return Ms{.dl = r < 20 ? 5.0 : -1.0, .fwd = 20, .bwd = 20, .opt = 5, .step = 52};
  });
  const std::vector<MissingSignal> missing = MissingSignals(w);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].reporting, 20u);
  ASSERT_EQ(missing[0].missing_ranks.size(), 16u);
  EXPECT_EQ(missing[0].missing_ranks.front(), 20u);
  EXPECT_EQ(missing[0].missing_ranks.back(), 35u);
}

}  // namespace
}  // namespace rankwatch::step_time
