// The lifetime memory trend (operators/memory_trend.h) and the creep it reports through the
// memory diagnosis, on series whose answer can be worked out by hand.
#include "operators/memory_trend.h"

#include <gtest/gtest.h>

#include <cmath>

#include "operators/memory_diagnosis.h"

namespace rankwatch {
namespace {

constexpr double kMiB = 1024.0 * 1024;

// Deterministic noise, uniform in [-1, 1).
class Noise {
 public:
  explicit Noise(uint64_t seed) : s_(seed * 2654435761u + 1) {}
  double Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return static_cast<double>(s_ >> 11) / static_cast<double>(1ull << 52) - 1.0;
  }

 private:
  uint64_t s_;
};

MemoryWindow::Step TrendStep(uint64_t step, double worst, double median) {
  return {step, 4, {worst, 0}, {median, 0}, 0};
}

// A job of `ranks` CPU-like ranks (allocated peaks only) fed to a window and a lifetime trend;
// `bytes(step, rank)` gives each rank's peak.
class Job {
 public:
  Job(uint32_t ranks, uint64_t capacity) : ranks_(ranks), capacity_(capacity), window_(ranks, {}) {}
  template <typename F>
  void Step(F bytes) {
    AlignedStep a{next_, ranks_, false, {}};
    for (uint32_t r = 0; r < ranks_; ++r) {
      StepSample s;
      s.step = next_;
      s.rank = r;
      s.peak_allocated_bytes = static_cast<uint64_t>(bytes(next_, r));
      s.device_capacity_bytes = capacity_;
      a.samples.push_back(s);
    }
    if (const MemoryWindow::Step* m = window_.Add(a)) trend_.Add(*m);
    ++next_;
  }
  MemoryDiagnosis Diagnose(const MemoryDiagnosisOptions& o = {}) const {
    return DiagnoseMemory(window_, &trend_, o);
  }
  const MemoryTrend& trend() const { return trend_; }
  uint64_t next_step() const { return next_; }

 private:
  uint32_t ranks_;
  uint64_t capacity_;
  MemoryWindow window_;
  MemoryTrend trend_;
  uint64_t next_ = 0;
};

bool IsCreep(MemoryLabel l) { return l == MemoryLabel::kCreep || l == MemoryLabel::kCreepEarly; }

TEST(TheilSenTest, ALineGivesItsSlopeWithAllPairsAndWithASubsample) {
  std::vector<double> x, y, scratch;
  for (int i = 0; i < 512; ++i) {
    x.push_back(i);
    y.push_back(7 + 3.0 * i);
  }
  // 512 points: 130,816 pairs; all of them, then every 64th (2,044 pairs).
  EXPECT_DOUBLE_EQ(TheilSenSlope(x.data(), y.data(), 512, 1 << 20, &scratch), 3.0);
  EXPECT_EQ(scratch.size(), 130816u);
  EXPECT_DOUBLE_EQ(TheilSenSlope(x.data(), y.data(), 512, 2048, &scratch), 3.0);
  EXPECT_EQ(scratch.size(), 2044u);
  EXPECT_EQ(TheilSenSlope(x.data(), y.data(), 1, 2048, &scratch), 0.0);
}

TEST(TheilSenTest, OneOutlierDoesNotMoveTheSlope) {
  // y = 1000 + 2x over x = 0..99, and one point 1e9 too high. 99 of the 4,950 pairs involve it;
  // the other 4,851 slopes are exactly 2, so their median is 2. (Least squares would move by
  // 1e9 x (50 - 49.5) / sum((x - 49.5)^2) = 1e9 x 0.5 / 83,325 = 6,001 per step.)
  std::vector<double> x, y, scratch;
  for (int i = 0; i < 100; ++i) {
    x.push_back(i);
    y.push_back(1000 + 2.0 * i);
  }
  y[50] += 1e9;
  EXPECT_DOUBLE_EQ(TheilSenSlope(x.data(), y.data(), 100, 1 << 20, &scratch), 2.0);
  EXPECT_DOUBLE_EQ(TheilSenSlope(x.data(), y.data(), 100, 512, &scratch), 2.0);
}

TEST(MemoryTrendTest, DownsamplingKeepsAtMost512PointsOfEqualStride) {
  MemoryTrend t;
  for (uint64_t s = 0; s < 100000; ++s) {
    t.Add(TrendStep(s, 200 * kMiB + 0.5 * kMiB * s, 100 * kMiB + 0.25 * kMiB * s));
    ASSERT_LE(t.point_count(MemoryKind::kAllocated), 512u) << s;
  }
  // 100,000 steps in < 512 full points: stride 256 (195 would do; strides double), 390 full
  // points and one of 160 steps still filling.
  EXPECT_EQ(t.stride(MemoryKind::kAllocated), 256u);
  EXPECT_EQ(t.point_count(MemoryKind::kAllocated), 391u);
  EXPECT_EQ(t.steps(MemoryKind::kAllocated), 100000u);
  EXPECT_EQ(t.point_count(MemoryKind::kReserved), 0u);  // no reserved peaks
  EXPECT_EQ(t.last_step(), 99999u);
  std::vector<MemoryTrend::Point> p;
  t.Points(MemoryKind::kAllocated, &p);
  EXPECT_DOUBLE_EQ(p[0].step, 127.5);  // mean of steps 0..255
  EXPECT_DOUBLE_EQ(p[0].worst, 200 * kMiB + 0.5 * kMiB * 127.5);
  EXPECT_DOUBLE_EQ(p[1].step, 383.5);
  EXPECT_DOUBLE_EQ(p.back().step, (99840 + 99999) / 2.0);  // the 160 steps still filling
  std::vector<double> scratch;
  const TrendFit f = FitTrend(p, TrendSeries::kWorst, 1.0 / 3, 2048, &scratch);
  EXPECT_DOUBLE_EQ(f.slope, 0.5 * kMiB);
  EXPECT_DOUBLE_EQ(f.recent_slope, 0.5 * kMiB);
  EXPECT_NEAR(f.level, 200 * kMiB + 0.5 * kMiB * 127.5, 1);
  EXPECT_NEAR(f.sigma, 0, 1);
}

TEST(MemoryTrendTest, StateRoundTripsExactlyAndMergesDownToASmallerBound) {
  MemoryTrend t;
  Noise noise(3);
  for (uint64_t s = 10; s < 1500; ++s) {
    const double v = 300 * kMiB + 4 * kMiB * noise.Next();
    t.Add({s, 4, {v, v * 1.1}, {v * 0.9, v}, 0});
  }
  auto back = MemoryTrend::FromState(t.ExportState(), {});
  ASSERT_TRUE(back.ok()) << back.status();
  for (MemoryKind k : {MemoryKind::kAllocated, MemoryKind::kReserved}) {
    std::vector<MemoryTrend::Point> a, b;
    t.Points(k, &a);
    back->Points(k, &b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].step, b[i].step);
      EXPECT_EQ(a[i].worst, b[i].worst);
      EXPECT_EQ(a[i].median, b[i].median);
    }
    EXPECT_EQ(back->stride(k), t.stride(k));
  }
  EXPECT_EQ(back->last_step(), 1499u);
  // 1,490 steps at stride 4: 372 full points and 2 steps filling. With a bound of 64 points:
  // stride 32, 46 full points (1,472 steps) and 18 steps filling.
  EXPECT_EQ(t.stride(MemoryKind::kAllocated), 4u);
  auto small = MemoryTrend::FromState(t.ExportState(), {.max_points = 64});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->stride(MemoryKind::kAllocated), 32u);
  EXPECT_EQ(small->point_count(MemoryKind::kAllocated), 47u);
  std::vector<MemoryTrend::Point> p;
  small->Points(MemoryKind::kAllocated, &p);
  EXPECT_DOUBLE_EQ(p[0].step, (10 + 41) / 2.0);
  EXPECT_DOUBLE_EQ(p.back().step, (1482 + 1499) / 2.0);

  state::v1::MemoryTrendState damaged = t.ExportState();
  damaged.mutable_kinds(0)->set_stride(3);
  EXPECT_EQ(MemoryTrend::FromState(damaged, {}).status().code(), absl::StatusCode::kDataLoss);
}

TEST(MemoryTrendDiagnosisTest, ASteadySlowLeakIsFoundWithItsRate) {
  // 4 ranks of ~200 MiB, each leaking 0.5 MiB a step, +-4 MiB of noise per rank and step,
  // 16 GiB of capacity. Over a 100-step window that is 50 MiB: under the window's 256 MiB floor.
  Job job(4, 16ull << 30);
  Noise noise(1);
  auto bytes = [&](uint64_t s, uint32_t r) {
    return 200 * kMiB + r * kMiB + 0.5 * kMiB * s + 4 * kMiB * noise.Next();
  };
  int64_t found_at = -1;
  while (job.next_step() < 400) {
    job.Step(bytes);
    if (found_at < 0 && IsCreep(job.Diagnose().label)) found_at = job.next_step();
  }
  // The trend needs 200 steps of span (trend_min_steps); by then the growth is 100 MiB, 50 %.
  EXPECT_GE(found_at, 200);
  EXPECT_LE(found_at, 210);
  const MemoryDiagnosis d = job.Diagnose();
  EXPECT_EQ(d.label, MemoryLabel::kCreep) << d.note;
  EXPECT_TRUE(d.lifetime_trend);
  const MemoryKindEvidence& e = d.kinds[0];
  // The window sees 3 % of growth (votes) but 40 MiB, under its 256 MiB floor: alone, nothing.
  EXPECT_LT(e.delta_bytes, 64 * kMiB);
  MemoryDiagnosisOptions window_only;
  window_only.trend = false;
  EXPECT_EQ(job.Diagnose(window_only).label, MemoryLabel::kBalanced);
  EXPECT_NEAR(e.creep_bytes_per_step / kMiB, 0.5, 0.01);
  EXPECT_TRUE(e.trend.steady);
  EXPECT_EQ(e.trend.steps, 400u);
  EXPECT_NEAR(e.trend.worst.span_steps, 399, 1e-9);
  // Full at (16,384 - ~403 MiB) / 0.5 MiB ~ 31,960 steps.
  ASSERT_TRUE(e.projected_steps_to_full.has_value());
  EXPECT_NEAR(static_cast<double>(*e.projected_steps_to_full), 31960, 150);
  EXPECT_NE(d.note.find("allocated memory grows 0.50 MiB a step over the job's 400 steps (steady"),
            std::string::npos)
      << d.note;
  EXPECT_NE(d.note.find("; full in ~31,9"), std::string::npos) << d.note;
}

TEST(MemoryTrendDiagnosisTest, GrowthThatLevelsOffIsNotCreep) {
  // Allocator warm-up: +2 MiB a step for the first 50 steps (200 -> 300 MiB), then flat, with
  // +-4 MiB of noise; never a creep over 3,000 steps.
  Job job(4, 16ull << 30);
  Noise noise(2);
  auto bytes = [&](uint64_t s, uint32_t) {
    return 200 * kMiB + 2 * kMiB * std::min<uint64_t>(s, 50) + 4 * kMiB * noise.Next();
  };
  while (job.next_step() < 3000) {
    job.Step(bytes);
    const MemoryDiagnosis d = job.Diagnose();
    ASSERT_FALSE(IsCreep(d.label)) << "step " << job.next_step() << ": " << d.note;
  }
  const MemoryTrendEvidence& t = job.Diagnose().kinds[0].trend;
  EXPECT_TRUE(t.present);
  EXPECT_FALSE(t.steady);
  EXPECT_LT(std::fabs(t.worst.recent_slope), 0.01 * kMiB);
}

TEST(MemoryTrendDiagnosisTest, GrowthThatLevelsOffLateInTheJobIsNotCreep) {
  // A cache that fills once after 1,000 steps (+2 MiB a step for 50 steps), then flat: never
  // a creep, on either horizon, over 4,000 steps.
  Job job(4, 16ull << 30);
  Noise noise(4);
  auto bytes = [&](uint64_t s, uint32_t) {
    const uint64_t grown = s < 1000 ? 0 : std::min<uint64_t>(s - 1000, 50);
    return 200 * kMiB + 2 * kMiB * static_cast<double>(grown) + 4 * kMiB * noise.Next();
  };
  while (job.next_step() < 4000) {
    job.Step(bytes);
    const MemoryDiagnosis d = job.Diagnose();
    ASSERT_FALSE(IsCreep(d.label)) << "step " << job.next_step() << ": " << d.note;
  }
}

TEST(MemoryTrendDiagnosisTest, ANoisyFlatSeriesIsNotCreep) {
  // 300 MiB +-15 MiB per rank and step (5 % noise), 5,000 steps.
  Job job(4, 16ull << 30);
  Noise noise(5);
  auto bytes = [&](uint64_t, uint32_t) { return 300 * kMiB + 15 * kMiB * noise.Next(); };
  while (job.next_step() < 5000) {
    job.Step(bytes);
    const MemoryDiagnosis d = job.Diagnose();
    ASSERT_FALSE(IsCreep(d.label)) << "step " << job.next_step() << ": " << d.note;
  }
  const MemoryTrendEvidence& t = job.Diagnose().kinds[0].trend;
  EXPECT_FALSE(t.steady);
  EXPECT_LT(std::fabs(t.worst.growth_bytes()), 2 * kMiB);  // slope x 5,000 steps
}

TEST(MemoryTrendDiagnosisTest, ALateSlowLeakIsFoundOnTheLaterHalf) {
  // 1,000 flat steps, then the slow leak of the first test (0.5 MiB a step on ~200 MiB, +-4 MiB).
  // The whole life's slope is the median of pairwise slopes, most of them between flat points:
  // alone it reports the leak at step 1,725 (+360 MiB); the later half of the points, at 1,269.
  Job job(4, 16ull << 30);
  Noise noise(7);
  auto bytes = [&](uint64_t s, uint32_t) {
    return 200 * kMiB + 0.5 * kMiB * static_cast<double>(s > 1000 ? s - 1000 : 0) +
           4 * kMiB * noise.Next();
  };
  auto found = [&](const MemoryDiagnosisOptions& o) {
    while (job.next_step() < 4000) {
      job.Step(bytes);
      if (IsCreep(job.Diagnose(o).label)) return static_cast<int64_t>(job.next_step());
    }
    return int64_t{-1};
  };
  const int64_t at = found({});
  EXPECT_GT(at, 1200);
  EXPECT_LT(at, 1350);
  const MemoryDiagnosis d = job.Diagnose();
  EXPECT_TRUE(d.lifetime_trend);
  EXPECT_TRUE(d.kinds[0].trend.last_half);
  // The rate: the recent third of the later half (the half itself still holds flat steps).
  EXPECT_NEAR(d.kinds[0].creep_bytes_per_step / kMiB, 0.5, 0.1);
  EXPECT_NE(d.note.find("a step now, steadily over the job's last 6"), std::string::npos) << d.note;
}

TEST(MemoryTrendDiagnosisTest, WithoutTheTrendOrWithItOffTheSlowLeakGoesUnseen) {
  Job job(4, 0);
  auto bytes = [](uint64_t s, uint32_t) { return 200 * kMiB + 0.5 * kMiB * s; };
  while (job.next_step() < 400) job.Step(bytes);
  EXPECT_EQ(job.Diagnose().label, MemoryLabel::kCreep);
  MemoryDiagnosisOptions off;
  off.trend = false;
  EXPECT_EQ(job.Diagnose(off).label, MemoryLabel::kBalanced);
  // Without a capacity there is no time to full.
  EXPECT_FALSE(job.Diagnose().kinds[0].projected_steps_to_full.has_value());
  EXPECT_EQ(job.Diagnose().note.find("full in"), std::string::npos);
}

TEST(MemoryTrendDiagnosisTest, SmallGrowthIsEarlyCreepAndLargerGrowthConfirmed) {
  // 0.1 MiB a step on 200 MiB, no noise: 20 MiB (10 %) at step 200 is under the 32 MiB floor;
  // at step 320 the 32 MiB floor and 10 % (early) are crossed; 25 % (confirmed) at step 500.
  Job job(4, 0);
  auto bytes = [](uint64_t s, uint32_t) { return 200 * kMiB + 0.1 * kMiB * s; };
  MemoryLabel at[3];
  while (job.next_step() < 600) {
    job.Step(bytes);
    if (job.next_step() == 310) at[0] = job.Diagnose().label;
    if (job.next_step() == 330) at[1] = job.Diagnose().label;
    if (job.next_step() == 510) at[2] = job.Diagnose().label;
  }
  EXPECT_EQ(at[0], MemoryLabel::kBalanced);
  EXPECT_EQ(at[1], MemoryLabel::kCreepEarly);
  EXPECT_EQ(at[2], MemoryLabel::kCreep);
}

}  // namespace
}  // namespace rankwatch
