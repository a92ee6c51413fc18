// The wire form of a step diagnosis whose cause is GC pauses, and of one without GC reports.
#include "serving/diagnosis_proto.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "operators/memory_diagnosis.h"
#include "operators/step_time/test_windows.h"

namespace rankwatch {
namespace {

using step_time::testing::Ms;
using step_time::testing::WindowOf;

// 4 DDP ranks with collective times; rank 2 pauses 40 ms in 3 collections inside backward every
// step, the others wait for it in the allreduce. `report_gc`: whether the collectors watch GC.
JobSnapshot Snapshot(bool report_gc) {
  const StepWindow w = WindowOf(4, 20, [report_gc](uint64_t, uint32_t r) {
    const bool slow = r == 2;
    Ms m{.dl = 5, .fwd = 20, .bwd = 65, .opt = 5, .coll = slow ? 5.0 : 45.0, .step = 95};
    if (report_gc) {
      m.gc = slow ? 40 : 0;
      m.gc_count = slow ? 3 : 0;
    }
    return m;
  });
  JobSnapshot s;
  s.training_job = "gc-job";
  s.world_size = 4;
  s.step = DiagnoseStepTime(w, std::vector<std::string>(4), {}, {});
  return s;
}

const v1::PhaseStats* Find(const v1::StepDiagnosis& d, v1::Phase phase) {
  auto it = std::find_if(d.phases().begin(), d.phases().end(),
                         [phase](const v1::PhaseStats& p) { return p.phase() == phase; });
  return it == d.phases().end() ? nullptr : &*it;
}

TEST(DiagnosisProtoTest, GcCauseWithItsEvidence) {
  v1::Diagnosis out;
  ToProto(Snapshot(true), 0, &out);
  const v1::StepDiagnosis& d = out.step();
  EXPECT_EQ(d.label(), v1::STEP_STRAGGLER) << d.note();
  EXPECT_EQ(d.cause(), v1::CAUSE_GC);
  EXPECT_EQ(d.culprit_phase(), v1::PHASE_GC);
  ASSERT_EQ(d.culprit_ranks_size(), 1);
  EXPECT_EQ(d.culprit_ranks(0), 2u);
  ASSERT_TRUE(d.has_gc());
  EXPECT_EQ(d.gc().ranks_reporting(), 4u);
  EXPECT_EQ(d.gc().rank(), 2u);
  EXPECT_NEAR(d.gc().seconds(), 0.040, 1e-9);
  EXPECT_NEAR(d.gc().collections(), 3, 1e-9);
  EXPECT_NEAR(d.gc().median_seconds(), 0, 1e-9);
  EXPECT_NEAR(d.gc().median_collections(), 0, 1e-9);
  const v1::PhaseStats* gc = Find(d, v1::PHASE_GC);
  ASSERT_NE(gc, nullptr);
  EXPECT_EQ(gc->worst_rank(), 2u);
  EXPECT_NEAR(gc->worst_seconds(), 0.040, 1e-9);
  ASSERT_EQ(gc->top_offenders_size(), 1);
  EXPECT_NEAR(gc->top_offenders(0).excess_seconds(), 0.040, 1e-9);
}

TEST(DiagnosisProtoTest, NoGcReportsNoGcEvidence) {
  v1::Diagnosis out;
  ToProto(Snapshot(false), 0, &out);
  EXPECT_FALSE(out.step().has_gc());
  EXPECT_EQ(Find(out.step(), v1::PHASE_GC), nullptr);
  EXPECT_NE(out.step().cause(), v1::CAUSE_GC);
}

TEST(DiagnosisProtoTest, TheTimingEvidenceIsOnTheWire) {
  v1::Diagnosis out;
  ToProto(Snapshot(false), 0, &out);
  ASSERT_TRUE(out.step().has_timing());
  EXPECT_EQ(out.step().timing().clock(), "host");
  EXPECT_EQ(out.step().timing().host_steps(), 80u);
  EXPECT_EQ(out.step().timing().device_steps(), 0u);
  JobSnapshot s = Snapshot(false);
  s.step.timing = {TimingClock::kMixed, 70, 10, 4};
  ToProto(s, 0, &out);
  EXPECT_EQ(out.step().timing().clock(), "mixed");
  EXPECT_EQ(out.step().timing().device_steps(), 70u);
  EXPECT_EQ(out.step().timing().host_steps(), 10u);
  EXPECT_EQ(out.step().timing().device_missing_steps(), 4u);
}

// Memory per rank on the wire: 4 ranks of ~250 MiB, rank 2 alone leaks 0.5 MiB a step, 300
// steps, a 64 GiB capacity.
TEST(DiagnosisProtoTest, AOneRankCreepNamesTheRankAndItsTrend) {
  constexpr double kMiB = 1024.0 * 1024;
  MemoryWindow window(4, {});
  MemoryTrend trend({}, 4);
  for (uint64_t step = 0; step < 300; ++step) {
    AlignedStep a{step, 4, false, {}};
    for (uint32_t r = 0; r < 4; ++r) {
      StepSample s;
      s.step = step;
      s.rank = r;
      const double wobble = static_cast<double>((step * 7 + r * 3) % 5) * kMiB;
      s.peak_allocated_bytes =
          static_cast<uint64_t>(250 * kMiB + wobble + (r == 2 ? 0.5 * kMiB * step : 0));
      s.device_capacity_bytes = 64ull << 30;
      a.samples.push_back(s);
    }
    if (const MemoryWindow::Step* m = window.Add(a)) trend.Add(*m, &window);
  }
  JobSnapshot s;
  s.training_job = "leaky-rank";
  s.world_size = 4;
  s.rank_nodes = std::make_shared<const std::vector<std::string>>(
      std::vector<std::string>{"n0", "n0", "n1", "n1"});
  s.memory = DiagnoseMemory(window, &trend, {});
  v1::Diagnosis out;
  ToProto(s, 0, &out);
  const v1::MemoryDiagnosis& m = out.memory();
  EXPECT_EQ(m.label(), v1::MEMORY_CREEP) << m.note();
  ASSERT_TRUE(m.has_creep_rank());
  EXPECT_EQ(m.creep_rank(), 2u);
  EXPECT_FALSE(m.creep_all_ranks());
  EXPECT_EQ(m.trend_ranks_followed(), 4u);
  ASSERT_GE(m.rank_trends_size(), 1);
  const v1::RankMemoryTrend& t = m.rank_trends(0);
  EXPECT_EQ(t.rank(), 2u);
  EXPECT_EQ(t.node(), "n1");
  EXPECT_NEAR(t.bytes_per_step() / kMiB, 0.5, 0.01);
  EXPECT_NEAR(m.creep_bytes_per_step() / kMiB, 0.5, 0.01);
  EXPECT_NEAR(t.growth(), 150.0 / 250, 0.05);
  EXPECT_TRUE(t.steady());
  EXPECT_EQ(t.steps(), 300u);
  EXPECT_TRUE(t.has_projected_steps_to_full());
  EXPECT_LE(m.rank_trends_size(), 8);
}

}  // namespace
}  // namespace rankwatch
