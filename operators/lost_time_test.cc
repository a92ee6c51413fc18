#include "operators/lost_time.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

// One rank's step in milliseconds: step time, and the collective wait (< 0: not reported).
StepWindow::Entry Entry(uint32_t rank, double step_ms, double collective_ms) {
  StepWindow::Entry e{rank, 0, {}};
  auto set = [&e](Phase p, double ms) {
    e.ns[static_cast<int>(p)] = static_cast<int64_t>(ms * 1e6);
    e.present |= 1u << static_cast<int>(p);
  };
  set(Phase::kStep, step_ms);
  if (collective_ms >= 0) set(Phase::kCollective, collective_ms);
  return e;
}

// 4 synchronised ranks, 75 ms steps; rank 2 waits 5 ms in the allreduce, the others 25: own
// time 70 ms on rank 2, 50 ms on the median rank. Loss: 4 x 20 ms = 0.08 rank-seconds a step.
StepWindow::Step SlowRank2(uint64_t step) {
  StepWindow::Step s{step, 4, {}};
  for (uint32_t r = 0; r < 4; ++r) s.entries.push_back(Entry(r, 75, r == 2 ? 5 : 25));
  return s;
}

BlockedModel Collective() { return {BlockedModel::Kind::kCollective, 0, 0}; }

TEST(LostTimeTest, AStragglerCostsEveryRankItsExcessOverTheMedianRank) {
  LostTime lost(4, 100);
  for (uint64_t s = 0; s < 10; ++s) lost.AddStep(SlowRank2(s), Collective());
  const LostTimeSummary sum = lost.Summary();
  EXPECT_NEAR(sum.total_straggler_rank_seconds, 0.8, 1e-9);
  EXPECT_NEAR(sum.total_rank_seconds, 4 * 0.075 * 10, 1e-9);
  EXPECT_NEAR(sum.window_straggler_rank_seconds, 0.8, 1e-9);
  ASSERT_EQ(sum.top.size(), 1u);
  EXPECT_EQ(sum.top[0].rank, 2u);
  EXPECT_NEAR(sum.top[0].total_rank_seconds, 0.8, 1e-9);
  EXPECT_DOUBLE_EQ(sum.total_hang_rank_seconds, 0);
  EXPECT_NEAR(lost.last_median_step_seconds(), 0.075, 1e-9);
}

TEST(LostTimeTest, TheWindowForgetsOldStepsAndTheTotalsDoNot) {
  LostTime lost(4, 5);
  for (uint64_t s = 0; s < 10; ++s) lost.AddStep(SlowRank2(s), Collective());
  const LostTimeSummary sum = lost.Summary();
  EXPECT_NEAR(sum.window_straggler_rank_seconds, 0.4, 1e-9);
  EXPECT_NEAR(sum.window_rank_seconds, 4 * 0.075 * 5, 1e-9);
  EXPECT_NEAR(sum.top[0].window_rank_seconds, 0.4, 1e-9);
  EXPECT_NEAR(sum.total_straggler_rank_seconds, 0.8, 1e-9);
}

TEST(LostTimeTest, IndependentRanksWaitForNobody) {
  LostTime lost(4, 100);
  for (uint64_t s = 0; s < 10; ++s) lost.AddStep(SlowRank2(s), BlockedModel{});
  EXPECT_DOUBLE_EQ(lost.Summary().total_straggler_rank_seconds, 0);
  EXPECT_NEAR(lost.Summary().total_rank_seconds, 3.0, 1e-9);
  EXPECT_TRUE(lost.Summary().top.empty());
}

TEST(LostTimeTest, AHangCostsEveryRankEverySecondAndTheStepThatEndsItNothingMore) {
  LostTime lost(4, 100);
  lost.AddHang(10, 4);
  lost.AddStep(SlowRank2(0), Collective(), /*ends_hang=*/true);
  const LostTimeSummary sum = lost.Summary();
  EXPECT_DOUBLE_EQ(sum.total_hang_rank_seconds, 40);
  EXPECT_DOUBLE_EQ(sum.total_rank_seconds, 40);
  EXPECT_DOUBLE_EQ(sum.total_straggler_rank_seconds, 0);
}

TEST(LostTimeTest, TotalsSurviveExportAndImport) {
  LostTime lost(4, 100);
  for (uint64_t s = 0; s < 10; ++s) lost.AddStep(SlowRank2(s), Collective());
  lost.AddHang(1, 4);
  LostTime restored(4, 100);
  ASSERT_TRUE(restored.ImportState(lost.ExportState()).ok());
  const LostTimeSummary a = lost.Summary(), b = restored.Summary();
  EXPECT_DOUBLE_EQ(a.total_rank_seconds, b.total_rank_seconds);
  EXPECT_DOUBLE_EQ(a.total_straggler_rank_seconds, b.total_straggler_rank_seconds);
  EXPECT_DOUBLE_EQ(a.total_hang_rank_seconds, b.total_hang_rank_seconds);
  ASSERT_EQ(b.top.size(), 1u);
  EXPECT_EQ(b.top[0].rank, 2u);
  EXPECT_DOUBLE_EQ(b.top[0].window_rank_seconds, 0);  // the window is rebuilt by the caller
}

TEST(LostTimeTest, ADamagedStateIsDataLoss) {
  state::v1::LostTimeState st;
  st.add_cost_ranks(7);  // out of range for 4 ranks
  st.add_cost_rank_ns(1);
  LostTime lost(4, 100);
  EXPECT_EQ(lost.ImportState(st).code(), absl::StatusCode::kDataLoss);
  st.add_cost_ranks(1);
  EXPECT_EQ(lost.ImportState(st).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rankwatch
