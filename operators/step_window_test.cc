#include "operators/step_window.h"

#include <gtest/gtest.h>

#include <cmath>

#include "operators/phase_stats.h"
#include "operators/step_time_diagnosis.h"
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

TEST(StepSampleTest, GcIsReportedWithItsTime) {
  v1::StepRecord r;
  r.set_step(3);
  r.set_step_time_ns(100'000'000);
  EXPECT_FALSE(ToStepSample(r, 0).HasGc());
  r.set_gc_count(2);  // a count without a time is no GC report
  EXPECT_FALSE(ToStepSample(r, 0).HasGc());
  r.set_gc_ns(0);  // timed, and no pause: a report of 0
  EXPECT_TRUE(ToStepSample(r, 0).HasGc());
  r.set_gc_ns(41'000'000);
  const StepSample s = ToStepSample(r, 0);
  EXPECT_TRUE(s.HasGc());
  EXPECT_EQ(s.gc_ns, 41'000'000);
  EXPECT_EQ(s.gc_count, 2u);
  EXPECT_FALSE(s.Has(Phase::kDataloader));  // the GC bit is no phase
  EXPECT_TRUE(s.Has(Phase::kStep));
}

TEST(StepWindowTest, SumsGcPausesOfTheStepsThatReportThem) {
  auto gc = [](StepSample s, int64_t ms, uint32_t count) {
    s.gc_ns = ms * 1'000'000;
    s.gc_count = count;
    s.present |= kGcBit;
    return s;
  };
  StepWindow w(3, {.steps = 2});
  w.Add(Step(0, {gc(Sample(0, 0), 100, 4), gc(Sample(1, 0), 1, 1), Sample(2, 0)}));
  w.Add(Step(1, {gc(Sample(0, 1), 20, 1), gc(Sample(1, 1), 0, 0), Sample(2, 1)}));
  w.Add(Step(2, {gc(Sample(0, 2), 40, 2), Sample(1, 2), Sample(2, 2)}));
  const auto& t0 = w.totals()[0];  // step 0 evicted
  EXPECT_EQ(t0.gc_sum_ns, 60'000'000);
  EXPECT_EQ(t0.gc_collections, 3u);
  EXPECT_EQ(t0.gc_steps, 2u);
  const auto& t1 = w.totals()[1];  // reported GC in step 1 only
  EXPECT_EQ(t1.gc_sum_ns, 0);
  EXPECT_EQ(t1.gc_steps, 1u);
  EXPECT_EQ(w.totals()[2].gc_steps, 0u);
  EXPECT_NEAR(WindowGcMean(t0), 0.030, 1e-12);
  EXPECT_NEAR(WindowGcCollections(t0), 1.5, 1e-12);
  EXPECT_NEAR(WindowGcMean(t1), 0, 1e-12);  // averaged over both of its steps
  EXPECT_TRUE(std::isnan(WindowGcMean(w.totals()[2])));
  EXPECT_EQ(w.steps().back().entries[0].gc_ns, 40'000'000);
  EXPECT_TRUE(w.steps().back().entries[0].HasGc());
  EXPECT_FALSE(w.steps().back().entries[1].HasGc());
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
