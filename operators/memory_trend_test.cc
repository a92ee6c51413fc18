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
  Job(uint32_t ranks, uint64_t capacity, MemoryTrendOptions trend = {})
      : ranks_(ranks), capacity_(capacity), window_(ranks, {}), trend_(trend, ranks) {}
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
    if (const MemoryWindow::Step* m = window_.Add(a)) trend_.Add(*m, &window_);
    ++next_;
  }
  MemoryDiagnosis Diagnose(const MemoryDiagnosisOptions& o = {}) const {
    return DiagnoseMemory(window_, &trend_, o);
  }
  const MemoryTrend& trend() const { return trend_; }
  const MemoryWindow& window() const { return window_; }
  uint64_t next_step() const { return next_; }
  // A trend restored from a checkpoint; steps up to `step` fill the window only (they are in
  // the checkpointed trend), as JobPipeline::Restore does with the stored steps.
  void RestoreTrend(MemoryTrend trend) { trend_ = std::move(trend); }
  void SkipTo(uint64_t step) { next_ = step; }

 private:
  uint32_t ranks_;
  uint64_t capacity_;
  MemoryWindow window_;
  MemoryTrend trend_;
  uint64_t next_ = 0;
};

bool IsCreep(MemoryLabel l) { return l == MemoryLabel::kCreep || l == MemoryLabel::kCreepEarly; }

// The note never says "steady and even" against its own numbers: a rank's or the job's trend
// that grew above its noise and the growth floor, or a skew past the imbalance threshold.
void ExpectNoteAgreesWithNumbers(const MemoryDiagnosis& d, const MemoryDiagnosisOptions& o = {}) {
  if (d.note.find("steady and even") == std::string::npos) return;
  const MemoryKindEvidence& e = d.kinds[static_cast<int>(d.kind)];
  EXPECT_LT(e.skew, o.imbalance_warn) << d.note;
  auto significant = [&](const TrendFit& f) {
    return f.present &&
           f.growth_bytes() >= std::max(o.trend_noise * f.sigma, o.trend_min_growth_bytes);
  };
  for (const RankTrendEvidence& r : e.rank_trends) {
    EXPECT_FALSE(significant(r.fit)) << "rank " << r.rank << ": " << d.note;
  }
  EXPECT_FALSE(e.trend.present && significant(e.trend.worst)) << d.note;
}

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
    ExpectNoteAgreesWithNumbers(d);
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

// Memory per rank (docs/diagnoses.md, "Memory per rank").

// The real job of issue #36: 4 ranks of ~262 MB, rank 0 alone keeps 0.5 MiB a step
// (rank-0-only logging), +-4 MiB of noise per rank and step.
double RankZeroLeaks(Noise& noise, uint64_t s, uint32_t r) {
  return 250 * kMiB + r * kMiB + (r == 0 ? 0.5 * kMiB * static_cast<double>(s) : 0.0) +
         4 * kMiB * noise.Next();
}

TEST(MemoryPerRankTest, OneRankLeakIsCreepOnThatRankWithItsRate) {
  for (uint64_t capacity : {uint64_t{64} << 30, uint64_t{0}}) {
    SCOPED_TRACE(capacity);
    Job job(4, capacity);
    Noise noise(11);
    int64_t found_at = -1;
    while (job.next_step() < 400) {
      job.Step([&](uint64_t s, uint32_t r) { return RankZeroLeaks(noise, s, r); });
      const MemoryDiagnosis d = job.Diagnose();
      ExpectNoteAgreesWithNumbers(d);
      if (found_at < 0 && IsCreep(d.label)) {
        found_at = static_cast<int64_t>(job.next_step());
        EXPECT_EQ(d.creep_scope, CreepScope::kRank) << d.note;
        EXPECT_EQ(d.creep_rank, 0u) << d.note;
      }
    }
    // The series span 200 steps at step 200 (trend_min_steps): +100 MiB, +40 %.
    EXPECT_GE(found_at, 200);
    EXPECT_LE(found_at, 215);
    const MemoryDiagnosis d = job.Diagnose();
    EXPECT_EQ(d.label, MemoryLabel::kCreep) << d.note;
    EXPECT_EQ(d.creep_scope, CreepScope::kRank);
    EXPECT_EQ(d.creep_rank, 0u);
    EXPECT_TRUE(d.lifetime_trend);
    const MemoryKindEvidence& e = d.kinds[0];
    // The median rank is flat: the job's trend alone says nothing.
    EXPECT_EQ(e.trend.label, MemoryLabel::kBalanced);
    EXPECT_NEAR(e.creep_bytes_per_step / kMiB, 0.5, 0.02);
    EXPECT_EQ(e.ranks_followed, 4u);
    ASSERT_FALSE(e.rank_trends.empty());
    EXPECT_EQ(e.rank_trends[0].rank, 0u);
    EXPECT_TRUE(e.rank_trends[0].steady);
    EXPECT_NEAR(e.rank_trends[0].growth, 200.0 / 250, 0.05);  // +200 MiB on 250 MiB
    EXPECT_NE(d.note.find("rank 0's allocated memory grows 0.5"), std::string::npos) << d.note;
    EXPECT_NE(d.note.find("over the job's 400 steps (steady, +"), std::string::npos) << d.note;
    EXPECT_NE(d.next_step.find("rank 0"), std::string::npos) << d.next_step;
    if (capacity > 0) {
      // (64 GiB - ~450 MiB) / 0.5 MiB ~ 130,170 steps.
      ASSERT_TRUE(e.projected_steps_to_full.has_value());
      EXPECT_NEAR(static_cast<double>(*e.projected_steps_to_full), 130170, 1500);
      ASSERT_TRUE(e.rank_trends[0].projected_steps_to_full.has_value());
      EXPECT_NE(d.note.find("; full in ~13"), std::string::npos) << d.note;
    } else {
      // Capacity unknown: the skew (rank 0 at +80 %) would be an imbalance, but its creep
      // explains it.
      EXPECT_GT(e.skew, MemoryDiagnosisOptions{}.imbalance_crit);
      EXPECT_FALSE(e.projected_steps_to_full.has_value());
    }
    // Without the per-rank series the same job was "balanced", "steady and even" (issue #36).
    MemoryDiagnosisOptions job_only;
    job_only.rank_trend = false;
    job_only.rank_window = false;
    const MemoryDiagnosis old = job.Diagnose(job_only);
    EXPECT_EQ(old.label, capacity > 0 ? MemoryLabel::kBalanced : MemoryLabel::kImbalance)
        << old.note;
    EXPECT_EQ(old.note.find("steady and even"), std::string::npos) << old.note;
  }
}

TEST(MemoryPerRankTest, AllRanksLeakingIsTheJobsCreepAtTheRanksOwnRate) {
  // Every rank leaks, rank 3 slower (0.35 MiB a step) from 60 MiB higher: the worst rank is
  // rank 3 until step 200, then the others, and the worst-rank series' slope mixes the two
  // rates (the flake of collectors_memory_trend). The rate reported is the median of the ranks'
  // own slopes: 0.65 MiB a step, as measured from outside.
  Job job(4, 16ull << 30);
  Noise noise(12);
  auto bytes = [&](uint64_t s, uint32_t r) {
    const double rate = r == 3 ? 0.35 : 0.65;
    return 200 * kMiB + (r == 3 ? 60 * kMiB : 0) + rate * kMiB * static_cast<double>(s) +
           2 * kMiB * noise.Next();
  };
  while (job.next_step() < 400) {
    job.Step(bytes);
    ExpectNoteAgreesWithNumbers(job.Diagnose());
  }
  const MemoryDiagnosis d = job.Diagnose();
  EXPECT_EQ(d.label, MemoryLabel::kCreep) << d.note;
  EXPECT_EQ(d.creep_scope, CreepScope::kJob);
  EXPECT_TRUE(d.lifetime_trend);
  const MemoryKindEvidence& e = d.kinds[0];
  EXPECT_NEAR(e.creep_bytes_per_step / kMiB, 0.65, 0.02);
  EXPECT_LT(e.trend.bytes_per_step() / kMiB, 0.6);  // the worst-rank series reads low
  EXPECT_NE(d.note.find("allocated memory grows 0.6"), std::string::npos) << d.note;
  EXPECT_NE(d.note.find("over the job's 400 steps"), std::string::npos) << d.note;
}

TEST(MemoryPerRankTest, OneRanksNoiseOrGrowthThatLevelsOffIsNeverCreep) {
  // Rank 2: +2 MiB a step for 50 steps (a cache it alone fills), then flat; rank 1: +-15 %
  // noise. 3,000 steps, a diagnosis every step: never a creep, and the note agrees.
  Job job(4, 16ull << 30);
  Noise noise(13);
  auto bytes = [&](uint64_t s, uint32_t r) {
    const double warm = r == 2 ? 2 * kMiB * static_cast<double>(std::min<uint64_t>(s, 50)) : 0;
    return 200 * kMiB + warm + (r == 1 ? 30 : 4) * kMiB * noise.Next();
  };
  while (job.next_step() < 3000) {
    job.Step(bytes);
    const MemoryDiagnosis d = job.Diagnose();
    ASSERT_FALSE(IsCreep(d.label)) << "step " << job.next_step() << ": " << d.note;
    ExpectNoteAgreesWithNumbers(d);
  }
  // Rank 2 stays 100 MiB above the others (40 % by the window peaks), on 2 % of its device: no
  // imbalance, and the note says why.
  const MemoryDiagnosis d = job.Diagnose();
  EXPECT_EQ(d.label, MemoryLabel::kBalanced);
  EXPECT_NE(d.note.find("no creep or imbalance: rank 2 peaks 4"), std::string::npos) << d.note;
  EXPECT_NE(d.note.find("an imbalance needs 30%"), std::string::npos) << d.note;
  const MemoryKindEvidence& e = d.kinds[0];
  for (const RankTrendEvidence& r : e.rank_trends) EXPECT_EQ(r.label, MemoryLabel::kBalanced);
}

// A job of `ranks` ranks, rank `leaker` leaking `mib` a step, the others flat with +-4 MiB.
void RunLeak(Job& job, uint64_t steps, uint32_t leaker, double mib, Noise& noise) {
  while (job.next_step() < steps) {
    job.Step([&](uint64_t s, uint32_t r) {
      return 1000 * kMiB + (r == leaker ? mib * kMiB * static_cast<double>(s) : 0.0) +
             4 * kMiB * noise.Next();
    });
  }
}

void ExpectSameTrend(const MemoryTrend& a, const MemoryTrend& b) {
  for (MemoryKind k : {MemoryKind::kAllocated, MemoryKind::kReserved}) {
    ASSERT_EQ(a.rank_series_count(k), b.rank_series_count(k));
    std::vector<double> ax, ay, bx, by;
    for (size_t i = 0; i < a.rank_series_count(k); ++i) {
      EXPECT_EQ(a.rank_of_series(k, i), b.rank_of_series(k, i));
      EXPECT_EQ(a.rank_series_steps(k, i), b.rank_series_steps(k, i));
      a.RankPoints(k, i, &ax, &ay);
      b.RankPoints(k, i, &bx, &by);
      EXPECT_EQ(ax, bx);
      EXPECT_EQ(ay, by);
    }
    for (uint32_t r = 0; r < a.world_size(); ++r) EXPECT_EQ(a.RankGrowth(k, r), b.RankGrowth(k, r));
  }
  EXPECT_EQ(a.ExportState().SerializeAsString(), b.ExportState().SerializeAsString());
}

TEST(MemoryPerRankTest, RankSeriesAndSummaryRestoreExactly) {
  // A small world (every rank followed) and a larger one (40 ranks: 32 followed, a summary),
  // checkpointed mid-block at step 250, restored, and both fed the same steps to step 600.
  for (uint32_t world : {4u, 40u}) {
    SCOPED_TRACE(world);
    Job job(world, 16ull << 30);
    Noise noise(14);
    RunLeak(job, 250, world - 1, 0.5, noise);
    const state::v1::MemoryTrendState saved = job.trend().ExportState();
    EXPECT_EQ(saved.rank_summaries_size(), world > 32 ? 2 : 0);
    auto restored = MemoryTrend::FromState(saved, {}, world);
    ASSERT_TRUE(restored.ok()) << restored.status();
    ExpectSameTrend(job.trend(), *restored);

    // Both go on with the same steps: the restored one fed from the same window.
    Job twin(world, 16ull << 30);
    twin.RestoreTrend(std::move(*restored));
    Noise a(15), b(15);
    RunLeak(job, 600, world - 1, 0.5, a);
    twin.SkipTo(250);
    RunLeak(twin, 600, world - 1, 0.5, b);
    ExpectSameTrend(job.trend(), twin.trend());
    // 350 steps on, the windows are the same too: so are the diagnoses.
    const MemoryDiagnosis d = job.Diagnose(), e = twin.Diagnose();
    EXPECT_EQ(d.label, e.label);
    EXPECT_EQ(d.note, e.note);
    EXPECT_EQ(d.kinds[0].creep_bytes_per_step, e.kinds[0].creep_bytes_per_step);
    EXPECT_EQ(d.creep_scope, CreepScope::kRank) << d.note;
    EXPECT_EQ(d.creep_rank, world - 1) << d.note;

    // State from before per-rank series loads (they start empty); a rank out of range does not.
    state::v1::MemoryTrendState old = saved;
    old.clear_rank_series();
    old.clear_rank_summaries();
    auto from_old = MemoryTrend::FromState(old, {}, world);
    ASSERT_TRUE(from_old.ok()) << from_old.status();
    EXPECT_EQ(from_old->steps(), 250u);
    for (size_t i = 0; i < from_old->rank_series_count(MemoryKind::kAllocated); ++i) {
      EXPECT_EQ(from_old->rank_series_steps(MemoryKind::kAllocated, i), 0u);
    }
    state::v1::MemoryTrendState damaged = saved;
    damaged.mutable_rank_series(0)->set_rank(world);
    EXPECT_EQ(MemoryTrend::FromState(damaged, {}, world).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(MemoryPerRankTest, SixteenThousandRanksFollowAtMost32AndFindTheLeakingRank) {
  // 16,384 ranks, rank 9,999 leaks 1 MiB a step on 1,000 MiB, the others flat with +-4 MiB: the
  // summary picks it at the first selection (step 32), its own series finds it.
  constexpr uint32_t kWorld = 16384;
  Job job(kWorld, 80ull << 30);
  Noise noise(16);
  RunLeak(job, 400, 9999, 1.0, noise);
  const MemoryTrend& t = job.trend();
  EXPECT_FALSE(t.follows_every_rank());
  for (MemoryKind k : {MemoryKind::kAllocated, MemoryKind::kReserved}) {
    EXPECT_LE(t.rank_series_count(k), 32u);
    for (size_t i = 0; i < t.rank_series_count(k); ++i) {
      EXPECT_LE(t.rank_series_points(k, i), 128u);
    }
  }
  bool followed = false;
  for (size_t i = 0; i < t.rank_series_count(MemoryKind::kAllocated); ++i) {
    if (t.rank_of_series(MemoryKind::kAllocated, i) == 9999) {
      followed = true;
      EXPECT_EQ(t.rank_series_steps(MemoryKind::kAllocated, i), 400u - 32u);
    }
  }
  EXPECT_TRUE(followed);
  // The checkpoint: the summary (about 12 bytes a rank a kind) and 32 series of <= 128 points.
  EXPECT_LT(t.ExportState().ByteSizeLong(), 24u * kWorld + 200'000u);
  const MemoryDiagnosis d = job.Diagnose();
  EXPECT_EQ(d.label, MemoryLabel::kCreep) << d.note;
  EXPECT_EQ(d.creep_scope, CreepScope::kRank);
  EXPECT_EQ(d.creep_rank, 9999u);
  EXPECT_NEAR(d.kinds[0].creep_bytes_per_step / kMiB, 1.0, 0.03);
  EXPECT_NE(d.note.find("over the last 368 steps"), std::string::npos) << d.note;
  EXPECT_LE(d.kinds[0].rank_trends.size(), 8u);
}

}  // namespace
}  // namespace rankwatch
