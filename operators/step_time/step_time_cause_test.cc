#include "operators/step_time/cause.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace rankwatch::step_time
