#include "operators/step_time/excess_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "operators/step_time/own_time.h"
#include "operators/step_time/test_windows.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

// Unsynchronised ranks (own time = step time): 100 ms steps, dataloader 5 ms, compute 95 ms,
// each phase with +-`jitter` uniform noise from `seed`; `extra(step, rank)` ms are added to the
// rank's compute.
StepWindow NoisyWindow(uint32_t ranks, uint64_t steps, double jitter, uint64_t seed,
                       const std::function<double(uint64_t, uint32_t)>& extra) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1 - jitter, 1 + jitter);
  return WindowOf(ranks, steps, [&](uint64_t s, uint32_t r) {
    const double dl = 5 * u(rng), fwd = 30 * u(rng), bwd = 60 * u(rng) + extra(s, r);
    const double opt = 5 * u(rng);
    return Ms{.dl = dl, .fwd = fwd, .bwd = bwd, .opt = opt, .step = dl + fwd + bwd + opt};
  });
}

constexpr double kBurden = 0.1;  // dataloader + compute of the median rank, seconds

ExcessTestResult TestRank(const StepWindow& w, uint32_t rank, const StepDiagnosisOptions& o = {}) {
  const BlockedModel none;
  const SignalReference ref = ReferenceOf(w, TestSignal::kOwn, none);
  return TestExcess(SeriesOf(w, TestSignal::kOwn, none, ref, rank), ref, kBurden, o, rank);
}

ExcessPattern PatternOf(const StepWindow& w, uint32_t rank, const StepDiagnosisOptions& o = {}) {
  const BlockedModel none;
  const SignalReference ref = ReferenceOf(w, TestSignal::kOwn, none);
  return DescribeExcess(SeriesOf(w, TestSignal::kOwn, none, ref, rank), ref, kBurden, o);
}

TEST(ExcessTest, AFivePercentExcessIsSignificantAgainstTheNoise) {
  const StepWindow w =
      NoisyWindow(8, 100, 0.05, 1, [](uint64_t, uint32_t r) { return r == 3 ? 5.0 : 0.0; });
  const ExcessTestResult x = TestRank(w, 3);
  ASSERT_TRUE(x.present);
  EXPECT_TRUE(x.significant);
  EXPECT_NEAR(x.excess, 0.005, 0.001);
  EXPECT_GT(x.z, 6);
  EXPECT_GT(x.noise, 0);
  // A typical rank is not.
  EXPECT_FALSE(TestRank(w, 5).significant);
}

TEST(ExcessTest, AnExcessUnderTheFloorIsNotAStragglerHoweverSignificant) {
  // 2 ms of a 100 ms step, without noise: infinitely significant, under the 3 % floor.
  const StepWindow w =
      NoisyWindow(8, 100, 0.0, 1, [](uint64_t, uint32_t r) { return r == 3 ? 2.0 : 0.0; });
  const ExcessTestResult x = TestRank(w, 3);
  EXPECT_FALSE(x.significant);
  StepDiagnosisOptions o;
  o.straggler_min_excess = 0.01;
  EXPECT_TRUE(TestRank(w, 3, o).significant);
}

TEST(ExcessTest, NoiseAloneIsNeverSignificant) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const StepWindow w = NoisyWindow(16, 100, 0.05, seed, [](uint64_t, uint32_t) { return 0.0; });
    for (uint32_t r = 0; r < 16; ++r) EXPECT_FALSE(TestRank(w, r).significant) << seed << " " << r;
  }
}

TEST(ExcessTest, ARecentOnsetIsFoundInTheNewestSteps) {
  // 10 ms more from step 84 on: 16 slow steps of 100, found in the newest 16.
  const StepWindow w = NoisyWindow(
      8, 100, 0.05, 2, [](uint64_t s, uint32_t r) { return r == 6 && s >= 84 ? 10.0 : 0.0; });
  const ExcessTestResult x = TestRank(w, 6);
  EXPECT_TRUE(x.significant);
  EXPECT_EQ(x.steps, 16u);
  EXPECT_NEAR(x.excess, 0.010, 0.002);
  const ExcessPattern p = PatternOf(w, 6);
  EXPECT_EQ(p.pattern, StragglerPattern::kSteady);
  EXPECT_NEAR(static_cast<double>(p.since_step), 84, 2);
}

TEST(ExcessTest, TwoStallsAreEventsNotAStraggler) {
  // A 300 ms checkpoint at steps 30 and 70: 6 ms a step on average, and nothing else.
  const StepWindow w = NoisyWindow(8, 100, 0.05, 3, [](uint64_t s, uint32_t r) {
    return r == 2 && (s == 30 || s == 70) ? 300.0 : 0.0;
  });
  EXPECT_FALSE(TestRank(w, 2).significant);
}

TEST(ExcessTest, PeriodicStallsAreAStragglerWithTheirPeriodAndLength) {
  // 250 ms every 10th step: 25 ms a step on average.
  const StepWindow w = NoisyWindow(
      4, 100, 0.05, 4, [](uint64_t s, uint32_t r) { return r == 1 && s % 10 == 7 ? 250.0 : 0.0; });
  const ExcessTestResult x = TestRank(w, 1);
  EXPECT_TRUE(x.significant);
  EXPECT_NEAR(x.excess, 0.025, 0.004);
  const ExcessPattern p = PatternOf(w, 1);
  EXPECT_EQ(p.pattern, StragglerPattern::kPeriodic);
  EXPECT_EQ(p.stalls, 10u);
  EXPECT_NEAR(p.period_steps, 10, 1e-9);
  EXPECT_NEAR(p.stall_seconds, 0.250, 0.015);
  EXPECT_EQ(p.since_step, 7u);
  EXPECT_FALSE(p.onset_in_window);  // a stall could have been at step -3: it held all along
  // Stalls from step 40 on: the window shows where they began.
  const StepWindow later = NoisyWindow(4, 100, 0.05, 4, [](uint64_t s, uint32_t r) {
    return r == 1 && s >= 40 && s % 10 == 7 ? 250.0 : 0.0;
  });
  const ExcessPattern q = PatternOf(later, 1);
  EXPECT_EQ(q.pattern, StragglerPattern::kPeriodic);
  EXPECT_EQ(q.since_step, 47u);
  EXPECT_TRUE(q.onset_in_window);
}

TEST(ExcessTest, IrregularStallsAreIntermittent) {
  const std::set<uint64_t> at = {5, 9, 31, 38, 60, 91};
  const StepWindow w = NoisyWindow(4, 100, 0.05, 5, [&](uint64_t s, uint32_t r) {
    return r == 0 && at.contains(s) ? 200.0 : 0.0;
  });
  const ExcessPattern p = PatternOf(w, 0);
  EXPECT_EQ(p.pattern, StragglerPattern::kIntermittent);
  EXPECT_EQ(p.stalls, 6u);
}

TEST(ExcessTest, ARisingExcessIsADriftWithItsRate) {
  // 0.2 ms more every step from step 20: 16 ms more by step 99.
  const StepWindow w = NoisyWindow(8, 100, 0.02, 6, [](uint64_t s, uint32_t r) {
    return r == 5 && s >= 20 ? 0.2 * static_cast<double>(s - 20) : 0.0;
  });
  const ExcessPattern p = PatternOf(w, 5);
  EXPECT_EQ(p.pattern, StragglerPattern::kDrift);
  // Fitted from where it began (a hinge), not across the flat steps before it.
  EXPECT_NEAR(p.drift_seconds_per_step, 0.0002, 0.00002);
  EXPECT_NEAR(static_cast<double>(p.since_step), 20, 5);
  EXPECT_TRUE(p.onset_in_window);
  EXPECT_EQ(p.stalls, 0u);
}

TEST(ExcessTest, AStrongDriftIsNotARunOfStalls) {
  // 0.5 ms more every step on a 100 ms step from step 20: 40 ms by the end, its newest steps far
  // above the series' median but each close to its neighbours.
  const StepWindow w = NoisyWindow(4, 100, 0.02, 10, [](uint64_t s, uint32_t r) {
    return r == 2 && s >= 20 ? 0.5 * static_cast<double>(s - 20) : 0.0;
  });
  const ExcessPattern p = PatternOf(w, 2);
  EXPECT_EQ(p.pattern, StragglerPattern::kDrift);
  EXPECT_NEAR(p.drift_seconds_per_step, 0.0005, 0.00005);
  EXPECT_TRUE(TestRank(w, 2).significant);
}

TEST(ExcessTest, AFewIrregularStallsAreNotAStragglerAFewRegularOnesAre) {
  // Three 67 ms stalls at irregular steps (another process took the core): left out.
  // Three 150 ms stalls at irregular steps (another process took the core): 4.5 ms a step on
  // average, above the floor, but left out.
  const std::set<uint64_t> at = {12, 47, 88};
  const StepWindow w = NoisyWindow(4, 100, 0.05, 11, [&](uint64_t s, uint32_t r) {
    return r == 2 && at.contains(s) ? 150.0 : 0.0;
  });
  EXPECT_FALSE(TestRank(w, 2).significant);
  // Three regular ones are a pattern, and count.
  const StepWindow regular = NoisyWindow(4, 100, 0.05, 11, [&](uint64_t s, uint32_t r) {
    return r == 2 && s % 30 == 12 ? 150.0 : 0.0;
  });
  EXPECT_TRUE(TestRank(regular, 2).significant);
  EXPECT_EQ(PatternOf(regular, 2).pattern, StragglerPattern::kPeriodic);
}

TEST(ExcessTest, AStepChangeIsNotADrift) {
  const StepWindow w = NoisyWindow(
      8, 100, 0.02, 7, [](uint64_t s, uint32_t r) { return r == 5 && s >= 50 ? 15.0 : 0.0; });
  const ExcessPattern p = PatternOf(w, 5);
  EXPECT_EQ(p.pattern, StragglerPattern::kSteady);
  EXPECT_NEAR(static_cast<double>(p.since_step), 50, 2);
  EXPECT_TRUE(p.onset_in_window);
}

TEST(ExcessTest, AStallInTheNewestStepOfASynchronisedJobKeepsItSynchronised) {
  // DDP with collective times: rank 1 stalls 250 ms at the end of every 10th step, and the
  // others wait for it in the next step's collective. The window ends on a stall, whose wait is
  // not in it yet: its ranks still run synchronised, and rank 1 is named, periodic.
  const StepWindow w = WindowOf(4, 100, [](uint64_t s, uint32_t r) {
    const bool stall = r == 1 && s % 10 == 9;
    const bool wait = r != 1 && s % 10 == 0 && s > 0;
    // The wait is in the collective, inside backward (DDP's allreduce); the stall outside every
    // phase, after the optimizer.
    const double wait_ms = wait ? 250.0 : 0.0;
    return Ms{.dl = 5,
              .fwd = 30,
              .bwd = 60 + wait_ms,
              .opt = 5,
              .coll = 5 + wait_ms,
              .step = 100 + wait_ms + (stall ? 250.0 : 0.0)};
  });
  EXPECT_LE(InnerStepSkew(w), 0.02);
  const StepDiagnosis d = DiagnoseStepTime(w, std::vector<std::string>(4), {}, {});
  EXPECT_EQ(d.culprit_ranks, std::vector<uint32_t>{1}) << d.note;
  EXPECT_TRUE(d.synchronized);
  EXPECT_EQ(d.straggler.pattern, StragglerPattern::kPeriodic) << d.note;
  EXPECT_EQ(d.straggler.period_steps, 10)
      << d.note << " z " << d.straggler.z << " rank " << d.straggler.rank << " excess "
      << d.straggler.excess_seconds;
  EXPECT_NEAR(d.straggler.stall_seconds, 0.250, 0.01) << d.note << " cause " << int(d.cause);
  // Every rank waits: the job loses the stall on all 4 ranks.
  EXPECT_NEAR(d.straggler.lost_rank_seconds_per_step, 4 * 0.025, 0.005);
}

TEST(ExcessTest, ReferencesOfLargeWorldsComeFromASample) {
  const StepWindow w = NoisyWindow(1000, 20, 0.05, 8, [](uint64_t, uint32_t) { return 0.0; });
  const SignalReference ref = ReferenceOf(w, TestSignal::kOwn, BlockedModel{});
  EXPECT_TRUE(ref.present);
  EXPECT_EQ(ref.reference_ranks, kReferenceRanks);
  ASSERT_EQ(ref.value.size(), 20u);
  EXPECT_NEAR(ref.value[0], 0.100, 0.005);
}

TEST(ExcessTest, ThroughTheDiagnosisAFivePercentRankIsNamedWithItsEvidence) {
  const StepWindow w =
      NoisyWindow(8, 100, 0.05, 9, [](uint64_t, uint32_t r) { return r == 3 ? 5.0 : 0.0; });
  const StepDiagnosis d = DiagnoseStepTime(w, std::vector<std::string>(8), {}, {});
  EXPECT_EQ(d.label, StepLabel::kComputeStraggler);
  EXPECT_TRUE(d.from_statistical_test);
  EXPECT_EQ(d.culprit_ranks, std::vector<uint32_t>{3});
  ASSERT_TRUE(d.straggler.present);
  EXPECT_EQ(d.straggler.rank, 3u);
  EXPECT_NEAR(d.straggler.excess_seconds, 0.005, 0.001);
  EXPECT_EQ(d.straggler.pattern, StragglerPattern::kSteady);
  // Unsynchronised: only the rank's own time is lost.
  EXPECT_NEAR(d.straggler.lost_rank_seconds_per_step, d.straggler.excess_seconds, 1e-12);
  EXPECT_EQ(d.severity, Severity::kWarn);
  EXPECT_NE(d.note.find("since step"), std::string::npos) << d.note;
  StepDiagnosisOptions off;
  off.statistical = false;
  // Without the test, the 5 % rank is under the share threshold: compute-bound, nobody named.
  const StepDiagnosis share_only = DiagnoseStepTime(w, std::vector<std::string>(8), {}, off);
  EXPECT_EQ(share_only.label, StepLabel::kComputeBound);
  EXPECT_TRUE(share_only.culprit_ranks.empty());
}

}  // namespace
}  // namespace rankwatch::step_time
