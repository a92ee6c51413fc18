#include "operators/step_time/excess_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <utility>
#include <vector>

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

// CannotBeSignificant(series, burden, options) claims that TestExcess cannot find the series
// significant whatever the reference's noise. These tests hold it to that against TestExcess
// itself, on series built directly (every shape the full test distinguishes: quiet ones, a mean
// near the floor over some tested length only, stalls, drifts, step changes) and on series of
// noisy windows.

// The reference noises tried: none at all (a noiseless reference: only the floor and the
// series' own spread stand in the way), tiny ones, and ones as large as the step.
std::vector<SignalReference> ReferenceNoises() {
  std::vector<SignalReference> out;
  for (const auto& [var, lrv] : std::vector<std::pair<double, double>>{{0, 0},
                                                                       {1e-300, 0},
                                                                       {0, 1e-300},
                                                                       {1e-18, 1e-18},
                                                                       {1e-10, 4e-10},
                                                                       {1e-6, 1e-6},
                                                                       {1e-5, 0},
                                                                       {4e-4, 1e-3},
                                                                       {1e-2, 1e-2}}) {
    SignalReference ref;
    ref.present = true;
    ref.noise_var = var;
    ref.noise_lrv = lrv;
    out.push_back(ref);
  }
  return out;
}

// A series of these values, its steps numbered from `first_step` (with a gap now and then, as
// missing steps leave).
ExcessSeries SeriesOfValues(const std::vector<double>& excess, uint64_t first_step = 0) {
  ExcessSeries s;
  uint64_t step = first_step;
  for (double v : excess) {
    s.steps.push_back(step);
    s.excess.push_back(v);
    step += 1 + (step % 23 == 22 ? 2 : 0);
  }
  return s;
}

// A random series around `floor` (straggler_min_excess x burden), of one of several shapes.
std::vector<double> RandomExcess(std::mt19937_64& rng, double floor, double burden) {
  std::uniform_int_distribution<int> len(0, 120);
  const size_t n = static_cast<size_t>(len(rng));
  // Where it sits: often within a few percent of the floor, on either side.
  static constexpr double kOffsets[] = {-1.0, 0.0,   0.5,  0.9, 0.97, 0.99, 0.999,
                                        1.0,  1.001, 1.01, 1.1, 1.5,  3.0};
  std::uniform_int_distribution<size_t> pick_offset(0, std::size(kOffsets));
  const size_t o = pick_offset(rng);
  const double offset = o < std::size(kOffsets)
                            ? kOffsets[o] * floor
                            : std::uniform_real_distribution<double>(-floor, 2 * floor)(rng);
  // Its noise, from none to several times the floor (and so, at the top, past the least stall
  // threshold of a quarter of the burden now and then).
  static constexpr double kNoise[] = {0, 1e-9, 1e-3, 0.01, 0.1, 0.3, 1.0, 3.0};
  const double sd =
      kNoise[std::uniform_int_distribution<size_t>(0, std::size(kNoise) - 1)(rng)] * floor;
  std::normal_distribution<double> noise(0, sd > 0 ? sd : 1);
  std::vector<double> v(n);
  for (double& x : v) x = offset + (sd > 0 ? noise(rng) : 0.0);
  if (n == 0) return v;
  std::uniform_int_distribution<size_t> at(0, n - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  switch (std::uniform_int_distribution<int>(0, 6)(rng)) {
    case 0:  // quiet
      break;
    case 1: {  // a few large stalls (a checkpoint, a GC pass), or many
      const int stalls = std::uniform_int_distribution<int>(1, 8)(rng);
      for (int k = 0; k < stalls; ++k) v[at(rng)] += burden * (0.2 + 3 * unit(rng));
      break;
    }
    case 2: {  // a drift from some step on, rising by up to twice the floor
      const size_t from = at(rng);
      const double rise = 2 * floor * unit(rng);
      for (size_t i = from; i < n; ++i) {
        v[i] += rise * static_cast<double>(i - from) / static_cast<double>(n - from);
      }
      break;
    }
    case 3: {  // a step change up or down, at any step
      const size_t from = at(rng);
      const double by = floor * (4 * unit(rng) - 2);
      for (size_t i = from; i < n; ++i) v[i] += by;
      break;
    }
    case 4: {  // only the newest 16 (or 32) steps over the floor: a recent onset
      const size_t recent = std::min(n, unit(rng) < 0.5 ? size_t{16} : size_t{32});
      for (size_t i = n - recent; i < n; ++i) v[i] = 1.02 * floor + (v[i] - offset);
      break;
    }
    case 5: {  // small excursions, up to just under a quarter of the burden (the least stall)
      const int k = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int j = 0; j < k; ++j) v[at(rng)] += 0.24 * burden * unit(rng);
      break;
    }
    case 6: {  // regular stalls (they stay in the mean)
      const size_t period = std::uniform_int_distribution<size_t>(3, 12)(rng);
      for (size_t i = at(rng) % period; i < n; i += period) v[i] += burden * (0.3 + unit(rng));
      break;
    }
  }
  return v;
}

// Whether the series is quiet by a margin: long enough, its spread well under the least stall
// threshold and its mean over every tested length well under the floor.
bool ClearlyQuiet(const std::vector<double>& v, double burden, const StepDiagnosisOptions& o) {
  const size_t n = v.size();
  if (n < std::max<size_t>(8, o.min_steps)) return false;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  if (*hi - *lo >= 0.9 * o.pattern_stall_share * burden) return false;
  for (size_t len : {size_t{16}, size_t{32}, size_t{64}, n}) {
    if (len > n) continue;
    double sum = 0;
    for (size_t i = n - len; i < n; ++i) sum += v[i];
    if (sum / static_cast<double>(len) >= 0.98 * o.straggler_min_excess * burden) return false;
  }
  return true;
}

TEST(CannotBeSignificantTest, WhenItSaysSoNoReferenceNoiseMakesTheTestSignificant) {
  std::vector<StepDiagnosisOptions> options(4);
  options[1].min_steps = 20;
  options[2].straggler_z = 0.5;  // a permissive z: the floor and the stalls decide alone
  options[2].straggler_min_excess = 0.05;
  options[3].straggler_z = 0;
  options[3].pattern_stall_share = 0.1;
  options[3].pattern_min_stalls = 2;
  const std::vector<SignalReference> noises = ReferenceNoises();
  std::mt19937_64 rng(20261129);
  size_t series = 0, cannot = 0, quiet = 0, quiet_cannot = 0, significant = 0;
  size_t cannot_long = 0;  // with enough steps to be tested
  for (int i = 0; i < 6000; ++i) {
    const StepDiagnosisOptions& o = options[static_cast<size_t>(i) % options.size()];
    const double burden = std::array<double, 4>{0.1, 0.02, 1.0, 0.37}[(i / 4) % 4];
    const double floor = o.straggler_min_excess * burden;
    const std::vector<double> v = RandomExcess(rng, floor, burden);
    const ExcessSeries s = SeriesOfValues(v, static_cast<uint64_t>(i));
    const bool no = CannotBeSignificant(s, burden, o);
    ++series;
    cannot += no;
    cannot_long += no && v.size() >= std::max<size_t>(8, o.min_steps);
    if (ClearlyQuiet(v, burden, o)) {
      ++quiet;
      quiet_cannot += no;
      EXPECT_TRUE(no) << "series " << i << ": quiet, of " << v.size() << " steps, under the floor";
    }
    for (const SignalReference& ref : noises) {
      const ExcessTestResult x = TestExcess(s, ref, burden, o, 7);
      significant += x.significant;
      if (no) {
        EXPECT_FALSE(x.significant)
            << "series " << i << " (" << v.size() << " steps, burden " << burden
            << "): CannotBeSignificant, yet significant with noise_var " << ref.noise_var
            << " noise_lrv " << ref.noise_lrv << ": excess " << x.excess << " over " << x.steps
            << " steps, z " << x.z;
      }
    }
  }
  std::printf(
      "%zu series: CannotBeSignificant for %zu (%zu long enough to test), %zu clearly quiet "
      "(%zu of them CannotBeSignificant); %zu significant tests of %zu\n",
      series, cannot, cannot_long, quiet, quiet_cannot, significant, series * noises.size());
  // The generator covers both sides: series it spares (long enough to be tested, not only the
  // short ones) and series the full test finds significant.
  EXPECT_GT(quiet, series / 20);
  EXPECT_EQ(quiet_cannot, quiet);
  EXPECT_GT(cannot_long, series / 10);
  EXPECT_GT(significant, series);
}

TEST(CannotBeSignificantTest, SeriesOfNoisyWindowsAgreeWithTheTest) {
  // Every rank of noisy windows, one rank with an excess near the 3 % floor (3 ms of 100), some
  // from a step on, some with stalls; the reference's measured noise and others.
  const BlockedModel none;
  std::vector<SignalReference> noises = ReferenceNoises();
  size_t ranks = 0, cannot = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const double extra = 0.5 * static_cast<double>(seed % 8);  // 0 to 3.5 ms
    const double jitter = seed % 3 == 0 ? 0.0 : (seed % 3 == 1 ? 0.005 : 0.05);
    const StepWindow w =
        NoisyWindow(8, 20 + 5 * seed, jitter, seed, [&](uint64_t s, uint32_t r) -> double {
          if (r == 3) return extra;
          if (r == 5 && s >= 50) return extra;
          if (r == 6 && s % 17 == 4) return 40.0;
          return 0.0;
        });
    for (TestSignal signal : {TestSignal::kInput, TestSignal::kCompute, TestSignal::kOwn}) {
      const SignalReference measured = ReferenceOf(w, signal, none);
      for (uint32_t r = 0; r < 8; ++r) {
        const ExcessSeries s = SeriesOf(w, signal, none, measured, r);
        const bool no = CannotBeSignificant(s, kBurden, {});
        ++ranks;
        cannot += no;
        if (!no) continue;
        EXPECT_FALSE(TestExcess(s, measured, kBurden, {}, r).significant)
            << "seed " << seed << " rank " << r;
        for (SignalReference ref : noises) {
          ref.steps = measured.steps;
          ref.value = measured.value;
          EXPECT_FALSE(TestExcess(s, ref, kBurden, {}, r).significant)
              << "seed " << seed << " rank " << r << " noise_var " << ref.noise_var;
        }
      }
    }
  }
  // Most ranks of most windows are spared (that is what it is for).
  EXPECT_GT(cannot, ranks / 2) << cannot << " of " << ranks;
}

// Options whose floor is a power of two, so that a mean can sit exactly on it: a floor of
// 1/64 s on a burden of 0.5 s, the least stall threshold 1/8 s. The series below take values
// that are multiples of 2^-40 s under 1 s, so every sum TestExcess forms is exact.
StepDiagnosisOptions DyadicOptions() {
  StepDiagnosisOptions o;
  o.straggler_min_excess = 0.03125;
  o.pattern_stall_share = 0.25;
  return o;
}
constexpr double kDyadicBurden = 0.5;
constexpr double kDyadicFloor = 0.015625;
const double kHair = std::ldexp(1.0, -40);

TEST(CannotBeSignificantTest, AMeanOfTheNewest16StepsOnTheFloorIsNotSpared) {
  const StepDiagnosisOptions o = DyadicOptions();
  ASSERT_EQ(o.straggler_min_excess * kDyadicBurden, kDyadicFloor);
  const SignalReference noiseless = ReferenceNoises().front();
  // 48 older steps well under the floor, then 16 whose mean is `newest`: the means over 32 and
  // 64 (all) steps stay under the floor; only the newest 16 can reach it.
  const auto series = [](double newest) {
    std::vector<double> v(48, 0.0);
    for (int i = 0; i < 16; ++i) v.push_back(newest + (i % 2 == 0 ? 0.0078125 : -0.0078125));
    return SeriesOfValues(v);
  };
  // Exactly on the floor: significant without noise (z about 7.7), so it must not be spared.
  const ExcessSeries at = series(kDyadicFloor);
  const ExcessTestResult x = TestExcess(at, noiseless, kDyadicBurden, o, 0);
  EXPECT_TRUE(x.significant);
  EXPECT_EQ(x.steps, 16u);
  EXPECT_EQ(x.excess, kDyadicFloor);
  EXPECT_FALSE(CannotBeSignificant(at, kDyadicBurden, o));
  // Just above it.
  const ExcessSeries above = series(kDyadicFloor + kHair);
  EXPECT_TRUE(TestExcess(above, noiseless, kDyadicBurden, o, 0).significant);
  EXPECT_FALSE(CannotBeSignificant(above, kDyadicBurden, o));
  // Just under it: spared, and indeed not significant, whatever the noise.
  const ExcessSeries under = series(kDyadicFloor - kHair);
  EXPECT_TRUE(CannotBeSignificant(under, kDyadicBurden, o));
  for (const SignalReference& ref : ReferenceNoises()) {
    EXPECT_FALSE(TestExcess(under, ref, kDyadicBurden, o, 0).significant) << ref.noise_var;
  }
  // At the default options' floor (3 % of 100 ms, not a binary fraction): a constant newest 16
  // steps on the floor as the options compute it, a float above it, and 0.01 % above it.
  const StepDiagnosisOptions d;
  const double floor = d.straggler_min_excess * kBurden;
  for (double v : {floor, std::nextafter(floor, 1.0), 1.0001 * floor}) {
    std::vector<double> values(48, 0.0);
    values.resize(64, v);
    const ExcessSeries s = SeriesOfValues(values);
    if (TestExcess(s, noiseless, kBurden, d, 0).significant) {
      EXPECT_FALSE(CannotBeSignificant(s, kBurden, d)) << v;
    } else {
      EXPECT_NE(v, 1.0001 * floor);
    }
  }
}

TEST(CannotBeSignificantTest, AMeanOnTheFloorOverAnyTestedLengthIsNotSpared) {
  // Each tested length in turn (16, 32, 64, all 100) the only one whose mean reaches the floor.
  const StepDiagnosisOptions o = DyadicOptions();
  for (size_t len : {size_t{16}, size_t{32}, size_t{64}, size_t{100}}) {
    // The newest `len` steps on the floor, the ones before them far under it. For len > 16 the
    // shorter lengths stay under it: the newest 8 steps low, the oldest 8 of the `len` high.
    std::vector<double> v(100, -2 * kDyadicFloor);
    for (size_t i = 100 - len; i < 100; ++i) v[i] = kDyadicFloor;
    if (len > 16) {
      for (size_t i = 100 - 8; i < 100; ++i) v[i] = kDyadicFloor - 0.0009765625;
      for (size_t i = 100 - len; i < 100 - len + 8; ++i) v[i] = kDyadicFloor + 0.0009765625;
    }
    const ExcessSeries s = SeriesOfValues(v);
    const ExcessTestResult x = TestExcess(s, ReferenceNoises()[0], kDyadicBurden, o, 0);
    ASSERT_TRUE(x.significant) << len;
    ASSERT_EQ(x.excess, kDyadicFloor) << len;
    ASSERT_EQ(x.steps, len);
    EXPECT_FALSE(CannotBeSignificant(s, kDyadicBurden, o)) << len;
    // A hair under the floor there: spared.
    for (size_t i = 100 - len; i < 100; ++i) v[i] -= kHair;
    EXPECT_TRUE(CannotBeSignificant(SeriesOfValues(v), kDyadicBurden, o)) << len;
    EXPECT_FALSE(
        TestExcess(SeriesOfValues(v), ReferenceNoises()[0], kDyadicBurden, o, 0).significant)
        << len;
  }
}

TEST(CannotBeSignificantTest, AStallCandidateIsNeverSpared) {
  const StepDiagnosisOptions o;
  // 63 steps 2 ms under the reference, one of them 30 ms over it (a stall: over a quarter of the
  // 100 ms burden above the baseline): every mean is under the 3 ms floor.
  std::vector<double> v(64, -0.002);
  v[10] = 0.030;
  EXPECT_FALSE(CannotBeSignificant(SeriesOfValues(v), kBurden, o));
  // A stall in the newest steps, too.
  v[10] = -0.002;
  v[63] = 0.030;
  EXPECT_FALSE(CannotBeSignificant(SeriesOfValues(v), kBurden, o));
  // Where leaving a stall out lifts the mean: 9 steps far under the reference, one a stall
  // over them, and 6 far over it (too many together to be stalls). With all of them the mean
  // is under the floor; without the stall, over it. A permissive z makes it significant.
  StepDiagnosisOptions lenient;
  lenient.straggler_z = 0.05;
  std::vector<double> w(10, -1.0);
  w[2] = -0.97;
  w.resize(16, 1.6);
  const ExcessSeries s = SeriesOfValues(w);
  double mean = 0;
  for (double x : w) mean += x / 16;
  ASSERT_LT(mean, lenient.straggler_min_excess * kBurden);
  ASSERT_TRUE(TestExcess(s, ReferenceNoises()[0], kBurden, lenient, 0).significant)
      << "the stall at step 2 is left out";
  EXPECT_FALSE(CannotBeSignificant(s, kBurden, lenient));
}

TEST(CannotBeSignificantTest, NoBurdenOrTooFewStepsCannotBeSignificant) {
  const StepDiagnosisOptions o;
  // A large excess, far over any floor, is spared only because the test cannot run.
  const std::vector<double> big(64, 0.05);
  for (double burden : {0.0, -0.1, -1e-300}) {
    EXPECT_TRUE(CannotBeSignificant(SeriesOfValues(big), burden, o)) << burden;
    for (const SignalReference& ref : ReferenceNoises()) {
      EXPECT_FALSE(TestExcess(SeriesOfValues(big), ref, burden, o, 0).significant);
    }
  }
  for (size_t n = 0; n < 8; ++n) {
    const ExcessSeries s = SeriesOfValues(std::vector<double>(n, 0.05));
    EXPECT_TRUE(CannotBeSignificant(s, kBurden, o)) << n;
    EXPECT_FALSE(TestExcess(s, ReferenceNoises()[0], kBurden, o, 0).present) << n;
  }
  // 8 steps are enough by default...
  EXPECT_FALSE(CannotBeSignificant(SeriesOfValues(std::vector<double>(8, 0.05)), kBurden, o));
  EXPECT_TRUE(
      TestExcess(SeriesOfValues(std::vector<double>(8, 0.05)), ReferenceNoises()[0], kBurden, o, 0)
          .significant);
  // ... not with min_steps 20.
  StepDiagnosisOptions longer;
  longer.min_steps = 20;
  EXPECT_TRUE(CannotBeSignificant(SeriesOfValues(std::vector<double>(19, 0.05)), kBurden, longer));
  EXPECT_FALSE(CannotBeSignificant(SeriesOfValues(std::vector<double>(20, 0.05)), kBurden, longer));
  // A quiet series well under the floor is spared; the same series over it is not.
  std::vector<double> quiet(100);
  for (size_t i = 0; i < quiet.size(); ++i) quiet[i] = 0.001 * std::sin(static_cast<double>(i));
  EXPECT_TRUE(CannotBeSignificant(SeriesOfValues(quiet), kBurden, o));
  for (double& x : quiet) x += 0.004;
  EXPECT_FALSE(CannotBeSignificant(SeriesOfValues(quiet), kBurden, o));
}

}  // namespace
}  // namespace rankwatch::step_time
