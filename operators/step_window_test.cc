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

TEST(StepSampleTest, TheRecordsClockIsKeptAndChangesNoPhase) {
  v1::StepRecord r;
  r.set_step(3);
  r.set_dataloader_ns(2'000'000);
  r.set_forward_ns(30'000'000);  // device time
  r.set_backward_ns(50'000'000);
  r.set_step_time_ns(100'000'000);
  r.mutable_host_phases()->set_forward_ns(4'000'000);  // when the host queued it
  r.mutable_host_phases()->set_backward_ns(6'000'000);
  const StepSample host = ToStepSample(r, 1);
  EXPECT_FALSE(host.DeviceTimed());
  EXPECT_FALSE(host.DeviceTimesMissing());
  r.set_clock(v1::STEP_CLOCK_DEVICE);
  const StepSample device = ToStepSample(r, 1);
  EXPECT_TRUE(device.DeviceTimed());
  EXPECT_FALSE(device.DeviceTimesMissing());
  EXPECT_EQ(device.present, host.present | kDeviceClockBit);
  EXPECT_EQ(device.ns, host.ns);  // the phase fields as they are: the best durations
  EXPECT_EQ(device.Get(Phase::kForward), 30'000'000);
  EXPECT_EQ(device.Get(Phase::kWait), 18'000'000);
  r.set_clock(v1::STEP_CLOCK_DEVICE_MISSING);
  const StepSample missing = ToStepSample(r, 1);
  EXPECT_FALSE(missing.DeviceTimed());
  EXPECT_TRUE(missing.DeviceTimesMissing());
  EXPECT_EQ(missing.present, host.present | kDeviceMissingBit);
  // The clock bits are above the phase and GC bits.
  for (int p = 0; p < kPhaseCount; ++p) {
    EXPECT_EQ(kDeviceClockBit & (1u << p), 0u);
    EXPECT_EQ(kDeviceMissingBit & (1u << p), 0u);
  }
  EXPECT_EQ((kDeviceClockBit | kDeviceMissingBit) & kGcBit, 0u);
  r.set_clock(static_cast<v1::StepClock>(7));  // a clock this daemon does not know: host
  EXPECT_EQ(ToStepSample(r, 1).present, host.present);
}

TEST(StepWindowTest, CountsTheRankStepsOfTheWindowByClock) {
  auto sample = [](uint32_t rank, uint64_t step, uint32_t clock_bit) {
    StepSample s = Sample(rank, step);
    s.present |= clock_bit;
    return s;
  };
  StepWindow w(3, {.steps = 4});
  // Steps 0-3: every rank on the device; 4-5: rank 2 on the host, rank 1's events late on 5.
  for (uint64_t step = 0; step < 6; ++step) {
    const bool late = step >= 4;
    w.Add(Step(step, {sample(0, step, kDeviceClockBit),
                      sample(1, step, step == 5 ? kDeviceMissingBit : kDeviceClockBit),
                      sample(2, step, late ? 0u : kDeviceClockBit)}));
  }
  // Steps 2-5 in the window: 12 rank-steps, 3 of them host, 1 of those a missing device time.
  EXPECT_EQ(w.clock_steps().device, 9u);
  EXPECT_EQ(w.clock_steps().host, 3u);
  EXPECT_EQ(w.clock_steps().device_missing, 1u);
  for (uint64_t step = 6; step < 10; ++step) {
    w.Add(Step(step, {Sample(0, step), Sample(1, step), Sample(2, step)}));
  }
  EXPECT_EQ(w.clock_steps().device, 0u);
  EXPECT_EQ(w.clock_steps().host, 12u);
  EXPECT_EQ(w.clock_steps().device_missing, 0u);
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
