#include "operators/step_time/scores.h"

#include <gtest/gtest.h>

#include "operators/step_time/test_windows.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

StragglerScores Scores(const StepWindow& w, const StepDiagnosisOptions& o = {}) {
  const WindowSignals s = MeasureWindow(w);
  return ScoreStragglers(w, s, ModelOwnTime(w, s, o, false), o);
}

// 5 unsynchronised ranks: dataloader 5 ms, compute 45 ms (burden 50); rank `slow` fetches for
// 15 ms.
Ms SlowInput(uint32_t r, uint32_t slow) {
  const double dl = r == slow ? 15 : 5;
  return Ms{.dl = dl, .fwd = 20, .bwd = 20, .opt = 5, .step = dl + 47};
}

TEST(ScoreStragglersTest, ExcessOverTheMedianRankPerUnitOfLocalWork) {
  const StragglerScores x =
      Scores(WindowOf(5, 20, [](uint64_t, uint32_t r) { return SlowInput(r, 1); }));
  EXPECT_NEAR(x.burden, 0.050, 1e-9);
  EXPECT_NEAR(x.onset_burden, 0.050, 1e-9);
  EXPECT_NEAR(x.input.full, 0.2, 1e-6);
  EXPECT_NEAR(x.input.onset, 0.2, 1e-6);
  EXPECT_EQ(x.input.onset_worst.rank, 1u);
  EXPECT_NEAR(x.own.full, 0.2, 1e-6);  // unsynchronised: own time is the step time
  EXPECT_NEAR(x.compute.score(), 0, 1e-9);
  EXPECT_TRUE(x.input_hit);
  EXPECT_TRUE(x.own_hit);
  EXPECT_FALSE(x.compute_hit);
  EXPECT_TRUE(x.any_hit());
}

TEST(ScoreStragglersTest, AShortWindowScoresOnlyTheNewestSteps) {
  // 10 steps, fewer than twice the 8 onset steps: the full-window means do not count yet.
  const StragglerScores x =
      Scores(WindowOf(5, 10, [](uint64_t, uint32_t r) { return SlowInput(r, 3); }));
  EXPECT_EQ(x.input.full, 0);
  EXPECT_EQ(x.input.onset_worst.rank, 3u);
  EXPECT_NEAR(x.input.onset, 0.2, 1e-6);
  EXPECT_TRUE(x.input_hit);
}

TEST(ScoreStragglersTest, TheWholeWindowCountsOnceItHoldsTwiceTheOnsetSteps) {
  // Rank 1 fetched for 25 ms in the first 10 of 20 steps: 10 ms more on average, in none of the
  // newest steps.
  const StragglerScores x = Scores(WindowOf(5, 20, [](uint64_t s, uint32_t r) {
    Ms m = SlowInput(r, 99);
    if (r == 1 && s < 10) m.dl = 25, m.step = 25 + 47;
    return m;
  }));
  EXPECT_NEAR(x.input.full, 0.2, 1e-6);
  EXPECT_NEAR(x.input.onset, 0, 1e-9);
  EXPECT_NEAR(x.input.score(), 0.2, 1e-6);
}

TEST(ScoreStragglersTest, ComputeReportedUnevenlyScoresNothing) {
  // Rank 2 computes 20 ms longer, but rank 3 does not time its optimizer.
  const StragglerScores x = Scores(WindowOf(5, 20, [](uint64_t, uint32_t r) {
    Ms m{.dl = 5, .fwd = r == 2 ? 40.0 : 20.0, .bwd = 20, .opt = 5, .step = 52};
    if (r == 3) m.opt = -1;
    return m;
  }));
  EXPECT_EQ(x.compute.full, 0);
  EXPECT_EQ(x.compute.onset, 0);
  EXPECT_FALSE(x.compute_hit);
}

TEST(ScoreStragglersTest, WithoutComputeTheBurdenIsTheStepTime) {
  const StragglerScores x = Scores(WindowOf(
      4, 20, [](uint64_t, uint32_t r) { return Ms{.dl = r == 1 ? 15.0 : 5.0, .step = 50}; }));
  EXPECT_NEAR(x.burden, 0.050, 1e-9);
  EXPECT_NEAR(x.input.score(), 0.2, 1e-6);
}

TEST(AtLeastTest, AllowsForRounding) {
  EXPECT_TRUE(AtLeast(0.09999999999999999, 0.10));
  EXPECT_FALSE(AtLeast(0.0999, 0.10));
}

TEST(LargestTest, TheLargestPositiveExcess) {
  const Excess e = Largest({NAN, 0.1, 0.3, -1});
  EXPECT_EQ(e.rank, 2u);
  EXPECT_DOUBLE_EQ(e.seconds, 0.3);
  const Excess none = Largest({-0.1, NAN});
  EXPECT_EQ(none.rank, 0u);
  EXPECT_EQ(none.seconds, 0);
}

}  // namespace
}  // namespace rankwatch::step_time
