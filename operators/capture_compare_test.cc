#include "operators/capture_compare.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

constexpr int64_t kUs = 1000;

// One DDP-like step of torch.profiler events on one thread, starting at `t0` us: forward
// (a linear layer, plus `extra_mm_us` of an extra matrix multiplication), backward, optimizer,
// and a gloo allreduce issued from backward.
std::vector<CapturedEvent> Step(int64_t step, int64_t t0, int64_t extra_mm_us) {
  auto ev = [&](const char* name, int64_t start_us, int64_t dur_us) {
    return CapturedEvent{name, "cpu_op", (t0 + start_us) * kUs, dur_us * kUs, 7, step};
  };
  std::vector<CapturedEvent> e = {
      ev("DistributedDataParallel.forward", 0, 100 + extra_mm_us),
      ev("aten::linear", 10, 50),
      ev("aten::addmm", 12, 46),
      ev("aten::relu", 60, 10),
  };
  if (extra_mm_us > 0) {
    e.push_back(ev("aten::matmul", 80, extra_mm_us));
    e.push_back(ev("aten::mm", 81, extra_mm_us - 2));
  }
  const int64_t b = 100 + extra_mm_us;
  e.push_back(ev("aten::mse_loss", b, 5));
  e.push_back(ev("autograd::engine::evaluate_function: AddmmBackward0", b + 10, 90));
  e.push_back(ev("aten::mm", b + 15, 40));
  e.push_back(ev("c10d::allreduce_", b + 60, 20));
  e.push_back(ev("Optimizer.step#SGD.step", b + 100, 20));
  e.push_back(ev("aten::add_", b + 102, 16));
  return e;
}

std::vector<CapturedEvent> Steps(int n, int64_t extra_mm_us) {
  std::vector<CapturedEvent> all;
  for (int s = 0; s < n; ++s) {
    auto e = Step(100 + s, s * 10'000, extra_mm_us);
    all.insert(all.end(), e.begin(), e.end());
  }
  return all;
}

double SelfUs(const CaptureProfile& p, const std::string& name, CapturePhase phase) {
  auto it = p.ops.find({name, phase});
  return it == p.ops.end() ? -1 : it->second.self_ns / kUs;
}

TEST(CaptureCompareTest, RangesNameThePhases) {
  EXPECT_EQ(PhaseOfRangeName("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
            CapturePhase::kDataloader);
  EXPECT_EQ(PhaseOfRangeName("DistributedDataParallel.forward"), CapturePhase::kForward);
  EXPECT_EQ(PhaseOfRangeName("autograd::engine::evaluate_function: MmBackward0"),
            CapturePhase::kBackward);
  EXPECT_EQ(PhaseOfRangeName("Optimizer.step#SGD.step"), CapturePhase::kOptimizer);
  EXPECT_EQ(PhaseOfRangeName("c10d::allreduce_"), CapturePhase::kCollective);
  EXPECT_EQ(PhaseOfRangeName("gloo:all_reduce"), CapturePhase::kCollective);
  EXPECT_EQ(PhaseOfRangeName("aten::mm"), CapturePhase::kOther);
}

TEST(CaptureCompareTest, SelfTimeCountsEachMicrosecondOnceInItsPhase) {
  const CaptureProfile p = BuildCaptureProfile(Steps(2, 0));
  EXPECT_EQ(p.steps, 2u);
  // aten::linear (50 us) holds aten::addmm (46 us): 4 us of its own.
  EXPECT_DOUBLE_EQ(SelfUs(p, "aten::linear", CapturePhase::kForward), 2 * 4);
  EXPECT_DOUBLE_EQ(SelfUs(p, "aten::addmm", CapturePhase::kForward), 2 * 46);
  EXPECT_DOUBLE_EQ(SelfUs(p, "DistributedDataParallel.forward", CapturePhase::kForward),
                   2 * (100 - 50 - 10));
  EXPECT_DOUBLE_EQ(SelfUs(p, "aten::mm", CapturePhase::kBackward), 2 * 40);
  EXPECT_DOUBLE_EQ(
      SelfUs(p, "autograd::engine::evaluate_function: AddmmBackward0", CapturePhase::kBackward),
      2 * (90 - 40 - 20));
  EXPECT_DOUBLE_EQ(SelfUs(p, "aten::add_", CapturePhase::kOptimizer), 2 * 16);
  // The loss sits in no named range.
  EXPECT_DOUBLE_EQ(SelfUs(p, "aten::mse_loss", CapturePhase::kOther), 2 * 5);
  // An allreduce issued from backward is a collective, not backward.
  EXPECT_DOUBLE_EQ(SelfUs(p, "c10d::allreduce_", CapturePhase::kCollective), 2 * 20);
  // Self times add up to the time the step's top-level events cover.
  const double covered = 2 * (100 + 5 + 90 + 20);
  EXPECT_DOUBLE_EQ(p.self_ns / kUs, covered);
}

TEST(CaptureCompareTest, AnExtraMatrixMultiplyInForwardLeadsTheCulpritsExcess) {
  const CaptureProfile culprit = BuildCaptureProfile(Steps(3, 400));
  const CaptureProfile reference = BuildCaptureProfile(Steps(3, 0));
  const std::vector<OpComparison> rows = CompareCaptures(culprit, reference, 5);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0].name, "aten::mm");
  EXPECT_EQ(rows[0].phase, CapturePhase::kForward);
  EXPECT_NEAR(rows[0].culprit_seconds_per_step, 398e-6, 1e-9);
  EXPECT_NEAR(rows[0].reference_seconds_per_step, 0, 1e-12);
  EXPECT_NEAR(rows[0].excess_seconds_per_step, 398e-6, 1e-9);
  EXPECT_DOUBLE_EQ(rows[0].culprit_calls_per_step, 1);
  // The backward aten::mm is the same on both: no excess.
  for (const OpComparison& r : rows) {
    if (r.name == "aten::mm" && r.phase == CapturePhase::kBackward) {
      EXPECT_NEAR(r.excess_seconds_per_step, 0, 1e-12);
    }
  }
  EXPECT_LE(rows.size(), 5u);
}

TEST(CaptureCompareTest, CollectivesComeAfterTheRanksOwnWork) {
  // The profiled culprit also spends 900 us a step in a gloo allreduce the reference does not
  // wait in (its peers' progress, the profiler's overhead): more than its extra matrix product.
  std::vector<CapturedEvent> culprit_events = Steps(3, 400);
  for (int s = 0; s < 3; ++s) {
    const int64_t end_of_step_us = s * 10'000 + 100 + 400 + 125;
    culprit_events.push_back(
        CapturedEvent{"gloo:all_reduce", "cpu_op", end_of_step_us * kUs, 900 * kUs, 7, 100 + s});
  }
  const std::vector<OpComparison> rows =
      CompareCaptures(BuildCaptureProfile(culprit_events), BuildCaptureProfile(Steps(3, 0)), 20);
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0].name, "aten::mm");
  EXPECT_EQ(rows[0].phase, CapturePhase::kForward);
  bool seen_collective = false, seen_wait = false;
  for (const OpComparison& r : rows) {
    if (r.phase == CapturePhase::kCollective) {
      seen_collective = true;
      if (r.name == "gloo:all_reduce") {
        seen_wait = true;
        EXPECT_NEAR(r.excess_seconds_per_step, 900e-6, 1e-9);
      }
    } else {
      EXPECT_FALSE(seen_collective) << r.name << " after a collective";
    }
  }
  EXPECT_TRUE(seen_wait);
}

TEST(CaptureCompareTest, NothingToCompareWithoutSteps) {
  const CaptureProfile empty = BuildCaptureProfile({});
  EXPECT_EQ(empty.steps, 0u);
  EXPECT_TRUE(CompareCaptures(empty, BuildCaptureProfile(Steps(1, 0)), 10).empty());
  // Events without a step are left out.
  std::vector<CapturedEvent> unstepped = Steps(1, 0);
  for (CapturedEvent& e : unstepped) e.step = -1;
  EXPECT_EQ(BuildCaptureProfile(unstepped).events, 0u);
}

TEST(CaptureCompareTest, ThreadsNestSeparately) {
  // The same interval on two threads: neither is the other's parent.
  std::vector<CapturedEvent> e = {{"a", "cpu_op", 0, 100, 1, 0}, {"b", "cpu_op", 10, 50, 2, 0}};
  const CaptureProfile p = BuildCaptureProfile(e);
  EXPECT_DOUBLE_EQ(SelfUs(p, "a", CapturePhase::kOther) * kUs, 100);
  EXPECT_DOUBLE_EQ(SelfUs(p, "b", CapturePhase::kOther) * kUs, 50);
}

}  // namespace
}  // namespace rankwatch
