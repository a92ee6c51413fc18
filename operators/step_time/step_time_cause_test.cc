#include "operators/step_time/cause.h"

#include <gtest/gtest.h>

#include <cmath>

#include "operators/step_time/test_windows.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

TEST(CauseOfTest, AnInputOrComputeCulpritIsBothWhenTheOtherSignalHitsToo) {
  const ExcessParts none;
  EXPECT_EQ(CauseOf(CulpritSignal::kInput, true, false, none), StragglerCause::kInput);
  EXPECT_EQ(CauseOf(CulpritSignal::kInput, true, true, none), StragglerCause::kBoth);
  EXPECT_EQ(CauseOf(CulpritSignal::kCompute, false, true, none), StragglerCause::kCompute);
  EXPECT_EQ(CauseOf(CulpritSignal::kCompute, true, true, none), StragglerCause::kBoth);
}

TEST(CauseOfTest, AnOwnTimeCulpritIsTheLargestPartOfItsExcess) {
  auto cause = [](double dl, double compute, double outside) {
    return CauseOf(CulpritSignal::kOwn, false, false,
                   {.own = 0.02, .dataloader = dl, .compute = compute, .outside = outside});
  };
  EXPECT_EQ(cause(0.001, 0.002, 0.017), StragglerCause::kOutside);
  EXPECT_EQ(cause(0.010, 0.002, 0.010), StragglerCause::kOutside);  // a tie goes outside
  EXPECT_EQ(cause(0.012, 0.008, 0), StragglerCause::kInput);
  EXPECT_EQ(cause(0.008, 0.008, 0), StragglerCause::kInput);
  EXPECT_EQ(cause(0.002, 0.018, -0.001), StragglerCause::kCompute);
  EXPECT_EQ(cause(0, -0.001, 0), StragglerCause::kNone);  // unattributed
}

// 4 DDP ranks with collective times, every step 75 ms; rank 2 spends 20 ms outside the phases
// and the others wait for it in the allreduce.
StepWindow SlowHost() {
  return WindowOf(4, 20, [](uint64_t, uint32_t r) {
    const bool slow = r == 2;
    return Ms{.dl = 5,
              .fwd = 20,
              .bwd = slow ? 25.0 : 45.0,
              .opt = 5,
              .coll = slow ? 5.0 : 25.0,
              .step = 75};
  });
}

TEST(ExcessPartsOfTest, SplitsTheOwnTimeExcess) {
  const StepWindow w = SlowHost();
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const ExcessParts x = ExcessPartsOf(2, s, t);
  EXPECT_NEAR(x.own, 0.020, 1e-9);
  EXPECT_NEAR(x.outside, 0.020, 1e-9);
  EXPECT_NEAR(x.dataloader, 0, 1e-9);
  EXPECT_NEAR(x.compute, 0, 1e-9);
}

TEST(ExcessPartsOfTest, APartSomeRanksDoNotReportCountsNothing) {
  // Rank 0 alone reports its dataloader, 40 ms; rank 1 only its step time.
  const StepWindow w = WindowOf(2, 20, [](uint64_t, uint32_t r) {
    return r == 0 ? Ms{.dl = 40, .fwd = 30, .bwd = 30, .opt = 10, .step = 116} : Ms{.step = 80};
  });
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const ExcessParts x = ExcessPartsOf(0, s, t);
  EXPECT_NEAR(x.own, 0.018, 1e-9);  // 116 against the median 98
  EXPECT_EQ(x.dataloader, 0);
  EXPECT_EQ(x.compute, 0);
  EXPECT_EQ(x.outside, 0);
}

TEST(CulpritPhaseOfTest, TheComputePhaseWithTheLargestLocalExcess) {
  // Rank 1's optimizer takes 25 ms instead of 5; its backward is shorter because the others
  // wait for it there. Backward less the collective is 20 ms on every rank.
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) {
    const bool slow = r == 1;
    return Ms{.dl = 5,
              .fwd = 20,
              .bwd = slow ? 25.0 : 45.0,
              .opt = slow ? 25.0 : 5.0,
              .coll = slow ? 5.0 : 25.0,
              .step = 75};
  });
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const ExcessParts x = ExcessPartsOf(1, s, t);
  const CulpritPhase p = CulpritPhaseOf(StragglerCause::kCompute, CulpritSignal::kOwn, 1, x, s, t);
  EXPECT_EQ(p.phase, Phase::kOptimizer);
  EXPECT_NEAR(p.excess, 0.020, 1e-9);
  EXPECT_NEAR(p.median, 0.005, 1e-9);
}

TEST(CulpritPhaseOfTest, BackwardCountsWithoutTheTimeBlockedInIt) {
  // Every backward takes 35 ms, but rank 1 computes 30 ms of it and the others 20 (they wait
  // 10 ms longer in the allreduce).
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) {
    return Ms{.dl = 5, .fwd = 20, .bwd = 35, .opt = 5, .coll = r == 1 ? 5.0 : 15.0, .step = 70};
  });
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const CulpritPhase p = CulpritPhaseOf(StragglerCause::kCompute, CulpritSignal::kCompute, 1,
                                        ExcessPartsOf(1, s, t), s, t);
  EXPECT_EQ(p.phase, Phase::kBackward);
  EXPECT_NEAR(p.excess, 0.010, 1e-9);
  EXPECT_NEAR(p.median, 0.020, 1e-9);
}

TEST(CulpritPhaseOfTest, OutsideAndUnattributedAreWaitInputIsTheDataloader) {
  const StepWindow w = SlowHost();
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const ExcessParts x{.own = 0.02, .dataloader = 0.003};
  EXPECT_EQ(CulpritPhaseOf(StragglerCause::kOutside, CulpritSignal::kOwn, 2, x, s, t).phase,
            Phase::kWait);
  EXPECT_EQ(CulpritPhaseOf(StragglerCause::kNone, CulpritSignal::kOwn, 2, x, s, t).phase,
            Phase::kWait);
  const CulpritPhase input =
      CulpritPhaseOf(StragglerCause::kBoth, CulpritSignal::kInput, 2, x, s, t);
  EXPECT_EQ(input.phase, Phase::kDataloader);
  EXPECT_EQ(input.excess, 0.003);
  EXPECT_NEAR(input.median, 0.005, 1e-9);
}

TEST(AttributeTest, RunsTheCauseAndThePhaseForTheCulprit) {
  const StepWindow w = SlowHost();
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  Culprit c;
  c.signal = CulpritSignal::kOwn;
  c.rank = 2;
  const Attribution a = Attribute(c, StragglerScores{}, s, t);
  EXPECT_EQ(a.cause, StragglerCause::kOutside);
  EXPECT_EQ(a.phase.phase, Phase::kWait);
  EXPECT_NEAR(a.parts.outside, 0.020, 1e-9);
}

TEST(GcExplainsTest, GcTakenOutOfThePartItFellInLeavesTheLargestPart) {
  // 40 ms of GC inside compute, which exceeds the median rank by 40 ms: nothing else remains.
  EXPECT_TRUE(GcExplains({.own = 0.040, .compute = 0.040, .gc = 0.040}, NAN));
  // A rank 60 ms slower in compute that also pauses 10 ms more: 50 ms of compute remain.
  EXPECT_FALSE(GcExplains({.own = 0.060, .compute = 0.060, .gc = 0.010}, NAN));
  // The pause comes out of the largest part: 40 ms of GC out of 50 ms of compute leave 35 ms
  // outside as the largest remaining part (out of the outside time, they would leave 50 ms of
  // compute standing beside them).
  EXPECT_TRUE(GcExplains({.own = 0.085, .compute = 0.050, .outside = 0.035, .gc = 0.040}, NAN));
  // 30 ms out of 45 ms of compute leave 40 ms outside: more than the GC.
  EXPECT_FALSE(GcExplains({.own = 0.085, .compute = 0.045, .outside = 0.040, .gc = 0.030}, NAN));
  // A pause between the phases: all of the outside time.
  EXPECT_TRUE(GcExplains({.own = 0.040, .outside = 0.040, .gc = 0.040}, NAN));
  // No GC excess (equal GC on every rank), or none reported.
  EXPECT_FALSE(GcExplains({.own = 0.040, .outside = 0.040, .gc = 0}, NAN));
}

TEST(GcExplainsTest, TheUnattributedRestCountsAgainstGc) {
  // Own time 100 ms above the median, no part holds it (e.g. sharded without collective times):
  // 30 ms of GC leave 70 ms unexplained.
  EXPECT_FALSE(GcExplains({.own = 0.100, .gc = 0.030}, NAN));
  EXPECT_TRUE(GcExplains({.own = 0.050, .gc = 0.030}, NAN));
  // The excess of the signal that named the culprit counts when it is larger than own time's
  // (own time unknown).
  EXPECT_FALSE(GcExplains({.gc = 0.020}, 0.050));
  EXPECT_TRUE(GcExplains({.gc = 0.020}, 0.030));
}

// 4 DDP ranks, every step 95 ms: dataloader 5, forward 20, local backward 20, optimizer 5,
// allreduce 5. Rank 2 pauses 40 ms in 3 collections inside backward every step; the others
// pause for none and wait for rank 2 40 ms longer in the allreduce at the end of backward
// (backward 65 ms everywhere).
Ms GcInBackward(uint32_t r) {
  const bool slow = r == 2;
  Ms m{.dl = 5, .fwd = 20, .bwd = 65, .opt = 5, .coll = slow ? 5.0 : 45.0, .step = 95};
  m.gc = slow ? 40 : 0;
  m.gc_count = slow ? 3 : 0;
  return m;
}

TEST(AttributeTest, GcInsideBackwardIsTheCauseWithCollectiveTimes) {
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) { return GcInBackward(r); });
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const StragglerScores scores = ScoreStragglers(w, s, t, {});
  ASSERT_TRUE(scores.compute_hit);  // compute: 85 ms on rank 2, 45 on the others
  const Culprit c = ChooseCulprit(scores, s, t);
  ASSERT_EQ(c.rank, 2u);
  const Attribution a = Attribute(c, scores, s, t);
  EXPECT_NEAR(a.parts.compute, 0.040, 1e-9);
  EXPECT_NEAR(a.parts.gc, 0.040, 1e-9);
  EXPECT_EQ(a.cause, StragglerCause::kGc);
}

TEST(AttributeTest, EqualGcOnEveryRankLeavesTheCauseWhereTheExcessIs) {
  // Every rank pauses 10 ms in forward; rank 1 also computes 30 ms longer in backward.
  const StepWindow w = WindowOf(4, 20, [](uint64_t, uint32_t r) {
    const bool slow = r == 1;
    Ms m{.dl = 5, .fwd = 30, .bwd = 55, .opt = 5, .coll = slow ? 5.0 : 35.0, .step = 95};
    m.gc = 10;
    m.gc_count = 1;
    return m;
  });
  const WindowSignals s = MeasureWindow(w);
  const OwnTimeSignals t = ModelOwnTime(w, s, {}, false);
  const StragglerScores scores = ScoreStragglers(w, s, t, {});
  const Culprit c = ChooseCulprit(scores, s, t);
  ASSERT_EQ(c.rank, 1u);
  const Attribution a = Attribute(c, scores, s, t);
  EXPECT_EQ(a.parts.gc, 0);
  EXPECT_EQ(a.cause, StragglerCause::kCompute);
}

}  // namespace
}  // namespace rankwatch::step_time
