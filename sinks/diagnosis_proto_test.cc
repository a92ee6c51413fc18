// The wire form of a step diagnosis whose cause is GC pauses, and of one without GC reports.
#include "sinks/diagnosis_proto.h"

#include <gtest/gtest.h>

#include <algorithm>

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

}  // namespace
}  // namespace rankwatch
