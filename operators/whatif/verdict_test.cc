// The what-if verdict's rules on window results built by hand: the decomposition by stage decides
// between a heavy stage and a moving replica; the held verdict's exit thresholds; VerdictHold's
// minimum duration.
#include "operators/whatif/verdict.h"

#include <gtest/gtest.h>

#include <vector>

namespace rankwatch::whatif {
namespace {

const Layout kLayout{.dp = 2, .pp = 2};
const std::vector<std::vector<uint32_t>> kWorkerRanks = {{0}, {1}, {2}, {3}};

// OpStats over `steps` steps whose workers (index stage * dp + data rank) computed `compute_ms`
// each, and paused in GC `gc_ms`.
OpStats Stats(const std::vector<double>& compute_ms, const std::vector<double>& gc_ms = {},
              int steps = 8) {
  OpStats stats(kLayout, 64);
  for (int s = 0; s < steps; ++s) {
    StepOps step;
    step.step = s;
    step.workers.resize(kLayout.workers());
    for (uint32_t w = 0; w < kLayout.workers(); ++w) {
      step.workers[w].push_back(
          Op{.kind = OpKind::kForwardCompute, .start_us = 0, .duration_us = compute_ms[w] * 1e3});
      if (w < gc_ms.size() && gc_ms[w] > 0) {
        step.workers[w].push_back(Op{.kind = OpKind::kGc, .duration_us = gc_ms[w] * 1e3});
      }
    }
    stats.Add(step);
  }
  return stats;
}

// A window of `steps` steps with slowdown `s`, decomposed by replica and stage as given; each
// step's slowest replica alternates (0, 1, 0, ...) and it alone explains that step, as a moving
// replica (or noise between two equally slow replicas) looks.
WindowResult Window(double s, std::vector<double> by_dp, std::vector<double> by_stage,
                    int steps = 32) {
  WindowResult r;
  r.steps = steps;
  r.ideal_us = 100e3;
  r.actual_us = s * r.ideal_us;
  r.measured_us = r.actual_us;
  r.slowdown = s;
  r.decomposition.by_dp_rank = std::move(by_dp);
  r.decomposition.by_stage = std::move(by_stage);
  r.decomposition.by_op_group = {{"forward-compute", s}};
  for (int i = 0; i < steps; ++i) {
    StepResult sr;
    sr.step = i;
    sr.slowdown = s;
    sr.decomposition.by_dp_rank =
        i % 2 == 0 ? std::vector<double>{s, 1.0} : std::vector<double>{1.0, s};
    r.per_step.push_back(sr);
  }
  return r;
}

TEST(WhatIfVerdict, AStageHeavierOnEveryReplicaIsAStageImbalanceWhateverReplicaIsSlowest) {
  // Stage 0 computes 1.5x stage 1 on both replicas; the slowest replica of each step alternates.
  const WindowResult r = Window(1.3, {1.2, 1.2}, {1.28, 1.02});
  const WhatIfVerdict v = JudgeWhatIf(r, kLayout, kWorkerRanks, Stats({15, 15, 10, 10}), {});
  EXPECT_EQ(v.verdict, Verdict::kStageImbalance) << v.note;
  EXPECT_EQ(v.stage, 0);
  EXPECT_EQ(v.ranks, (std::vector<uint32_t>{0, 1}));
}

TEST(WhatIfVerdict, EvenStagesWithAMovingReplicaAreASequenceImbalance) {
  // The same window, but every replica's stages compute alike: the replicas differ.
  const WindowResult r = Window(1.3, {1.2, 1.2}, {1.28, 1.02});
  const WhatIfVerdict v = JudgeWhatIf(r, kLayout, kWorkerRanks, Stats({15, 10, 15, 10}), {});
  EXPECT_EQ(v.verdict, Verdict::kSequenceImbalance) << v.note;
}

TEST(WhatIfVerdict, AStageHeavyOnOneReplicaOnlyIsASlowWorker) {
  // Worker (data rank 1, stage 0) computes 1.5x; every step its replica is the slowest.
  WindowResult r = Window(1.2, {1.01, 1.19}, {1.18, 1.01});
  for (StepResult& sr : r.per_step) sr.decomposition.by_dp_rank = {1.0, 1.2};
  const WhatIfVerdict v = JudgeWhatIf(r, kLayout, kWorkerRanks, Stats({10, 15, 10, 10}), {});
  EXPECT_EQ(v.verdict, Verdict::kSlowWorker) << v.note;
  EXPECT_EQ(v.data_rank, 1);
  EXPECT_EQ(v.stage, 0);
}

TEST(WhatIfVerdict, WeightGradientOpsAreComputeNotCommunication) {
  // Zero-bubble: stage 0's weight-gradient ops (W) take twice as long as stage 1's, and that
  // op group explains most of S. It is compute: stage 0 is heavier on every replica by its W
  // ops alone, so the verdict names the stage, not a slow link.
  WindowResult r = Window(1.3, {1.2, 1.2}, {1.28, 1.02});
  r.decomposition.by_op_group = {{"backward-weight-compute", 1.27}, {"forward-compute", 1.0}};
  OpStats stats(kLayout, 64);
  for (int i = 0; i < 8; ++i) {
    StepOps step;
    step.step = i;
    step.workers.resize(kLayout.workers());
    for (uint32_t w = 0; w < kLayout.workers(); ++w) {
      step.workers[w] = {Op{.kind = OpKind::kForwardCompute, .start_us = 0, .duration_us = 10e3},
                         Op{.kind = OpKind::kBackwardWeightCompute,
                            .start_us = 10e3,
                            .duration_us = w / kLayout.dp == 0 ? 10e3 : 5e3}};
    }
    stats.Add(step);
  }
  EXPECT_DOUBLE_EQ(stats.StageComputeUs()[0], 20e3);
  const WhatIfVerdict v = JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {});
  EXPECT_EQ(v.verdict, Verdict::kStageImbalance) << v.note;
  EXPECT_EQ(v.stage, 0);
}

TEST(WhatIfVerdict, AHeldFindingEndsBelowTheExitSlowdownOnly) {
  const OpStats stats = Stats({15, 15, 10, 10});
  const WindowResult r = Window(1.04, {1.035, 1.035}, {1.038, 1.0});
  const WhatIfVerdict fresh = JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {});
  EXPECT_EQ(fresh.verdict, Verdict::kBalanced) << "1.04 is below the entry threshold 1.05";
  WhatIfVerdict held;
  held.verdict = Verdict::kStageImbalance;
  held.stage = 0;
  const WhatIfVerdict kept = JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {}, &held);
  EXPECT_EQ(kept.verdict, Verdict::kStageImbalance) << kept.note;
  EXPECT_EQ(kept.severity, Severity::kWarn);
  const WindowResult low = Window(1.02, {1.02, 1.02}, {1.02, 1.0});
  EXPECT_EQ(JudgeWhatIf(low, kLayout, kWorkerRanks, stats, {}, &held).verdict, Verdict::kBalanced);
}

TEST(WhatIfVerdict, AHeldCriticalSeverityEndsBelowTheCriticalExit) {
  const OpStats stats = Stats({15, 15, 10, 10});
  const WindowResult r = Window(1.17, {1.15, 1.15}, {1.16, 1.0});
  WhatIfVerdict held;
  held.verdict = Verdict::kStageImbalance;
  held.stage = 0;
  EXPECT_EQ(JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {}, &held).severity, Severity::kWarn);
  held.severity = Severity::kCrit;
  EXPECT_EQ(JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {}, &held).severity, Severity::kCrit);
}

TEST(WhatIfVerdict, HeldGcPausesKeepWhileTheyExplainTheKeepShare) {
  // GC explains 40 % of S - 1: not enough to enter (50 %), enough to stay (35 %).
  WindowResult r = Window(1.2, {1.08, 1.08}, {1.08, 1.08});
  r.decomposition.by_op_group = {{"gc", 1.08}, {"forward-compute", 1.05}};
  const OpStats stats = Stats({10, 10, 10, 10}, {0, 0, 8, 0});
  EXPECT_NE(JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {}).verdict, Verdict::kGcPauses);
  WhatIfVerdict held;
  held.verdict = Verdict::kGcPauses;
  held.op_group = "gc";
  const WhatIfVerdict kept = JudgeWhatIf(r, kLayout, kWorkerRanks, stats, {}, &held);
  EXPECT_EQ(kept.verdict, Verdict::kGcPauses) << kept.note;
  EXPECT_EQ(kept.ranks, (std::vector<uint32_t>{2}));
}

WhatIfVerdict V(Verdict kind, int32_t stage = -1, double slowdown = 1.1) {
  WhatIfVerdict v;
  v.verdict = kind;
  v.stage = stage;
  v.slowdown = slowdown;
  return v;
}

TEST(WhatIfVerdictHold, AnotherFindingReplacesTheHeldOneAfterHoldSteps) {
  VerdictHold hold(16);
  EXPECT_EQ(hold.held(), nullptr);
  EXPECT_EQ(hold.Update(V(Verdict::kStageImbalance, 0, 1.3), 10).verdict, Verdict::kStageImbalance);
  // A sequence imbalance judged for 15 steps: the stage imbalance stays, with the current S.
  for (uint64_t analysed = 11; analysed <= 25; analysed += 2) {
    const WhatIfVerdict& shown = hold.Update(V(Verdict::kSequenceImbalance, -1, 1.25), analysed);
    EXPECT_EQ(shown.verdict, Verdict::kStageImbalance) << analysed;
    EXPECT_DOUBLE_EQ(shown.slowdown, 1.25);
  }
  EXPECT_EQ(hold.candidate().verdict, Verdict::kSequenceImbalance);
  EXPECT_EQ(hold.candidate_since(), 11u);
  EXPECT_EQ(hold.Update(V(Verdict::kSequenceImbalance), 26).verdict, Verdict::kStageImbalance);
  EXPECT_EQ(hold.Update(V(Verdict::kSequenceImbalance), 27).verdict, Verdict::kSequenceImbalance);
  EXPECT_EQ(hold.candidate().verdict, Verdict::kNone);
}

TEST(WhatIfVerdictHold, AnInterruptedCandidateStartsAgain) {
  VerdictHold hold(16);
  hold.Update(V(Verdict::kBalanced), 4);
  hold.Update(V(Verdict::kSequenceImbalance), 5);
  hold.Update(V(Verdict::kSequenceImbalance), 15);
  // The held finding judged again: the candidate is dropped.
  hold.Update(V(Verdict::kBalanced), 16);
  EXPECT_EQ(hold.Update(V(Verdict::kSequenceImbalance), 21).verdict, Verdict::kBalanced);
  EXPECT_EQ(hold.candidate_since(), 21u);
  // Another culprit is another finding: the stage-1 candidate restarts the count.
  hold.Update(V(Verdict::kStageImbalance, 0), 30);
  EXPECT_EQ(hold.candidate_since(), 30u);
  hold.Update(V(Verdict::kStageImbalance, 1), 35);
  EXPECT_EQ(hold.candidate_since(), 35u);
  EXPECT_EQ(hold.Update(V(Verdict::kStageImbalance, 1), 50).verdict, Verdict::kBalanced);
  EXPECT_EQ(hold.Update(V(Verdict::kStageImbalance, 1), 51).stage, 1);
}

TEST(WhatIfVerdictHold, NoWhatIfDropsTheHeldVerdictAndZeroHoldsNothing) {
  VerdictHold hold(16);
  hold.Update(V(Verdict::kStageImbalance, 0), 10);
  EXPECT_EQ(hold.Update(V(Verdict::kNone), 11).verdict, Verdict::kNone);
  EXPECT_EQ(hold.held(), nullptr);
  EXPECT_EQ(hold.Update(V(Verdict::kBalanced), 12).verdict, Verdict::kBalanced);
  VerdictHold at_once(0);
  at_once.Update(V(Verdict::kBalanced), 4);
  EXPECT_EQ(at_once.Update(V(Verdict::kSlowWorker), 5).verdict, Verdict::kSlowWorker);
}

TEST(WhatIfVerdictHold, RestoreGivesTheSameNextVerdicts) {
  VerdictHold a(16), b(16);
  a.Update(V(Verdict::kStageImbalance, 0), 10);
  a.Update(V(Verdict::kSequenceImbalance), 12);
  b.Restore(a.held(), a.candidate(), a.candidate_since());
  for (uint64_t analysed : {20, 27, 28, 40}) {
    EXPECT_TRUE(SameFinding(a.Update(V(Verdict::kSequenceImbalance), analysed),
                            b.Update(V(Verdict::kSequenceImbalance), analysed)))
        << analysed;
  }
}

}  // namespace
}  // namespace rankwatch::whatif
