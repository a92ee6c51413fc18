#include "operators/step_time/own_time.h"

#include <gtest/gtest.h>

#include "operators/step_time/test_windows.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

// 4 DDP ranks, every step 75 ms: dataloader 5, forward 20, local backward 20, optimizer 5,
// allreduce 5. Rank 2 also spends 20 ms between forward and backward in no phase; the others
// wait for it in the allreduce (backward 45, collective 25; rank 2's 25 and 5).
Ms SlowHost(uint32_t r, bool collective) {
  const bool slow = r == 2;
  Ms m{.dl = 5, .fwd = 20, .bwd = slow ? 25.0 : 45.0, .opt = 5, .step = 75};
  if (collective) m.coll = slow ? 5 : 25;
  return m;
}

OwnTimeSignals Model(const StepWindow& w, bool sharded = false) {
  return ModelOwnTime(w, MeasureWindow(w), StepDiagnosisOptions{}, sharded);
}

TEST(ModelOwnTimeTest, CollectiveTimeIsTheBlockedTime) {
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) { return SlowHost(r, true); });
  const OwnTimeSignals t = Model(w);
  EXPECT_TRUE(t.synchronized);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kCollective);
  EXPECT_NEAR(t.own[2], 0.070, 1e-9);  // 75 - 5
  EXPECT_NEAR(t.own[0], 0.050, 1e-9);  // 75 - 25
  EXPECT_NEAR(t.compute[2], 0.045, 1e-9);
  EXPECT_NEAR(t.compute[3], 0.045, 1e-9);
  EXPECT_NEAR(t.outside[2], 0.020, 1e-9);
  EXPECT_NEAR(t.outside[1], 0.0, 1e-9);
  EXPECT_EQ(t.own_evidence.stat.worst_rank, 2u);
  EXPECT_NEAR(t.own_evidence.stat.median_seconds, 0.050, 1e-9);
  EXPECT_EQ(t.outside_evidence.stat.worst_rank, 2u);
}

TEST(ModelOwnTimeTest, WithoutCollectiveTimeBackwardIsCalibratedByTheLeastWaitingRank) {
  // The least backward/forward ratio is rank 2's, 25 / 20: the others' backward holds 20 ms
  // of waiting.
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) { return SlowHost(r, false); });
  const OwnTimeSignals t = Model(w);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kBackward);
  EXPECT_NEAR(t.blocked.ratio, 1.25, 1e-9);
  EXPECT_NEAR(t.own[2], 0.075, 1e-9);
  EXPECT_NEAR(t.own[1], 0.055, 1e-9);
  EXPECT_NEAR(t.compute[0], 0.050, 1e-9);  // 20 x 2.25 + 5
  EXPECT_NEAR(t.outside[2], 0.020, 1e-9);
}

TEST(ModelOwnTimeTest, UnsynchronisedRanksBlockNothing) {
  const StepWindow w = WindowOf(3, 20, [](uint64_t, uint32_t r) {
    return Ms{.dl = 5, .fwd = 20, .bwd = 20, .opt = 5, .coll = 3, .step = 52.0 + 10 * r};
  });
  const OwnTimeSignals t = Model(w);
  EXPECT_FALSE(t.synchronized);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kNone);
  EXPECT_NEAR(t.own[2], 0.072, 1e-9);      // the step time
  EXPECT_NEAR(t.compute[2], 0.042, 1e-9);  // less the collective
  EXPECT_NEAR(t.outside[2], 0.025, 1e-9);
}

TEST(ModelOwnTimeTest, OneRankWaitsForNobody) {
  const StepWindow w = WindowOf(1, 20, [](uint64_t, uint32_t) {
    return Ms{.dl = 5, .fwd = 20, .bwd = 20, .opt = 5, .coll = 3, .step = 52};
  });
  const OwnTimeSignals t = Model(w);
  EXPECT_FALSE(t.synchronized);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kNone);
  EXPECT_NEAR(t.own[0], 0.052, 1e-9);
}

TEST(ModelOwnTimeTest, AShardedJobWaitsInForwardToo) {
  // Rank 2 spends 15 ms outside the phases; the others wait for it in forward's all-gathers.
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) {
    return Ms{.dl = 5, .fwd = r == 2 ? 20.0 : 35.0, .bwd = 20, .opt = 5, .step = 65};
  });
  const OwnTimeSignals t = Model(w, /*sharded=*/true);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kSharded);
  EXPECT_NEAR(t.blocked.least_forward_backward, 0.040, 1e-9);
  EXPECT_NEAR(t.own[2], 0.065, 1e-9);
  EXPECT_NEAR(t.own[0], 0.050, 1e-9);
  EXPECT_NEAR(t.compute[0], 0.045, 1e-9);
}

TEST(ModelOwnTimeTest, UnknownBlockedTimeLeavesOwnTimeUnknown) {
  // Synchronised, no collective, forward without backward: nothing calibrates the waiting.
  const StepWindow w = WindowOf(
      2, 20, [](uint64_t, uint32_t) { return Ms{.dl = 5, .fwd = 20, .opt = 5, .step = 40}; });
  const OwnTimeSignals t = Model(w);
  EXPECT_EQ(t.blocked.kind, BlockedModel::Kind::kUnknown);
  EXPECT_TRUE(std::isnan(t.own[0]));
  EXPECT_TRUE(std::isnan(t.outside[0]));
  EXPECT_FALSE(t.own_evidence.stat.present);
  EXPECT_NEAR(t.compute[0], 0.025, 1e-9);  // forward + optimizer
}

TEST(NewestStepsTest, TheLeastExcessOverEachStepsMedianRank) {
  // 5 unsynchronised ranks. Rank 1 fetches for 15 ms instead of 5 in every step; rank 3 only in
  // step 15, one of the newest 8; rank 4 in every step before them.
  const StepWindow w = WindowOf(5, 20, [](uint64_t s, uint32_t r) {
    const bool slow = r == 1 || (r == 3 && s == 15) || (r == 4 && s < 12);
    const double dl = slow ? 15 : 5;
    return Ms{.dl = dl, .fwd = 20, .bwd = 20, .opt = 5, .step = dl + 47};
  });
  const OnsetSignals o = NewestSteps(w, 8, BlockedModel{});
  EXPECT_NEAR(o.dl_excess[1], 0.010, 1e-9);
  EXPECT_NEAR(o.dl_excess[3], 0.0, 1e-9);
  EXPECT_NEAR(o.dl_excess[4], 0.0, 1e-9);
  EXPECT_NEAR(o.own_excess[1], 0.010, 1e-9);
  EXPECT_NEAR(o.compute_excess[1], 0.0, 1e-9);
  EXPECT_NEAR(o.burden, 0.050, 1e-9);  // dataloader 5 + compute 45
}

TEST(NewestStepsTest, ARankWithoutAValueHasNone) {
  const StepWindow w = WindowOf(2, 10, [](uint64_t, uint32_t r) {
    return Ms{.dl = r == 0 ? 5.0 : -1.0, .fwd = 20, .step = 30};
  });
  const OnsetSignals o = NewestSteps(w, 8, BlockedModel{});
  EXPECT_NEAR(o.dl_excess[0], 0.0, 1e-9);
  EXPECT_TRUE(std::isnan(o.dl_excess[1]));
}

TEST(LessGcTest, TakesTheGcOutOfAPhaseUpToHalfOfIt) {
  EXPECT_DOUBLE_EQ(LessGc(0.085, 0.040), 0.045);
  EXPECT_DOUBLE_EQ(LessGc(0.060, 0.040), 0.030);  // a longer pause fell elsewhere in part
  EXPECT_DOUBLE_EQ(LessGc(0.060, 0), 0.060);
}

// Synchronised without collective times: forward 40 ms, local backward 40 (+5 allreduce); rank 2
// pauses 40 ms for GC in backward, the others wait as long in it. Backward is 85 ms everywhere.
StepWindow GcInBackward() {
  return WindowOf(4, 20, [](uint64_t, uint32_t r) {
    Ms m{.dl = 5, .fwd = 40, .bwd = 85, .opt = 5, .step = 135};
    m.gc = r == 2 ? 40 : 0;
    return m;
  });
}

TEST(ModelOwnTimeTest, AGcPauseIsNeverBlockedTime) {
  const StepWindow w = GcInBackward();
  const OwnTimeSignals t = Model(w);
  ASSERT_EQ(t.blocked.kind, BlockedModel::Kind::kBackward);
  EXPECT_NEAR(t.blocked.ratio, 45.0 / 40, 1e-9);  // rank 2's backward less its GC
  EXPECT_NEAR(t.own[2], 0.135, 1e-9);
  EXPECT_NEAR(t.own[0], 0.095, 1e-9);  // 40 ms blocked
  EXPECT_NEAR(t.compute[2], 0.040 * 2.125 + 0.005, 1e-9);
  EXPECT_NEAR(t.outside[2], 0.040, 1e-9);  // where the pause shows
  // Step by step too (fast onset).
  const OnsetSignals o = NewestSteps(w, 8, t.blocked);
  EXPECT_NEAR(o.own_excess[2], 0.040, 1e-9);
  EXPECT_NEAR(o.own_excess[0], 0, 1e-9);
}

TEST(OwnTimeTest, EstimatedModelsTakeTheGcOutOfTheWaitingPhase) {
  std::array<double, kPhaseCount> v{};
  v[PhaseIndex(Phase::kForward)] = 0.040;
  v[PhaseIndex(Phase::kBackward)] = 0.085;
  v[PhaseIndex(Phase::kStep)] = 0.135;
  const uint32_t present =
      PhaseBit(Phase::kForward) | PhaseBit(Phase::kBackward) | PhaseBit(Phase::kStep);
  const BlockedModel backward{.kind = BlockedModel::Kind::kBackward, .ratio = 1.125};
  EXPECT_NEAR(OwnTime(v, present, backward), 0.095, 1e-12);
  EXPECT_NEAR(OwnTime(v, present, backward, 0.040), 0.135, 1e-12);
  const BlockedModel sharded{.kind = BlockedModel::Kind::kSharded, .least_forward_backward = 0.085};
  EXPECT_NEAR(OwnTime(v, present, sharded), 0.095, 1e-12);
  EXPECT_NEAR(OwnTime(v, present, sharded, 0.040), 0.135, 1e-12);
  const BlockedModel least{.kind = BlockedModel::Kind::kLeastBackward,
                           .least_forward_backward = 0.045};
  EXPECT_NEAR(OwnTime(v, present, least), 0.095, 1e-12);
  EXPECT_NEAR(OwnTime(v, present, least, 0.040), 0.135, 1e-12);
  // A measured collective is waiting, whatever the GC.
  v[PhaseIndex(Phase::kCollective)] = 0.010;
  EXPECT_NEAR(OwnTime(v, present | PhaseBit(Phase::kCollective),
                      {.kind = BlockedModel::Kind::kCollective}, 0.040),
              0.125, 1e-12);
}

TEST(ComputeOfTest, EachBlockedModelTakesItsPart) {
  std::array<double, kPhaseCount> v{};
  v[PhaseIndex(Phase::kForward)] = 0.020;
  v[PhaseIndex(Phase::kBackward)] = 0.045;
  v[PhaseIndex(Phase::kOptimizer)] = 0.005;
  v[PhaseIndex(Phase::kCollective)] = 0.025;
  const uint32_t present = PhaseBit(Phase::kForward) | PhaseBit(Phase::kBackward) |
                           PhaseBit(Phase::kOptimizer) | PhaseBit(Phase::kCollective);
  EXPECT_NEAR(ComputeOf(v, present, {.kind = BlockedModel::Kind::kCollective}), 0.045, 1e-12);
  EXPECT_NEAR(ComputeOf(v, present, {.kind = BlockedModel::Kind::kBackward, .ratio = 1.25}), 0.050,
              1e-12);
  EXPECT_NEAR(ComputeOf(v, present,
                        {.kind = BlockedModel::Kind::kSharded, .least_forward_backward = 0.040}),
              0.045, 1e-12);
  EXPECT_NEAR(
      ComputeOf(v, present,
                {.kind = BlockedModel::Kind::kLeastBackward, .least_forward_backward = 0.030}),
      0.055, 1e-12);
  EXPECT_NEAR(ComputeOf(v, present, {.kind = BlockedModel::Kind::kUnknown}), 0.025, 1e-12);
  EXPECT_TRUE(
      std::isnan(ComputeOf(v, PhaseBit(Phase::kBackward), {.kind = BlockedModel::Kind::kUnknown})));
}

}  // namespace
}  // namespace rankwatch::step_time
