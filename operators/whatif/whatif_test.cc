// The what-if analyzer on small hand-built steps whose step times are worked out by hand in
// the comments (times in ms; the ops carry µs).
#include "operators/whatif/whatif.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace rankwatch::whatif {
namespace {

using K = OpKind;
constexpr double kMs = 1000;

Op O(OpKind kind, double start_ms, double end_ms, uint16_t microbatch = 0) {
  return Op{kind, microbatch, 0, start_ms * kMs, (end_ms - start_ms) * kMs};
}

std::map<std::string, double> GroupsOf(const Decomposition& d) {
  return {d.by_op_group.begin(), d.by_op_group.end()};
}

// Two stages, one data rank, two microbatches in 1F1B. Stage 0: forward 10, backward 20;
// stage 1: forward 15, backward 30; every send/receive pair 1 after the later of the two
// starts; optimizer 5. The model's timeline, which these ops are:
//   s0 F0 0-10, fsend0 10-11 (frecv0 0-11), F1 10-20, fsend1 20-27 (frecv1 waits for s1's F0:
//   26-27), brecv0 10-57 (bsend0 56-57), B0 57-77, brecv1 77-102 (bsend1 101-102), B1 102-122,
//   optimizer 122-127;
//   s1 F0 11-26, B0 26-56, F1 56-71, B1 71-101, optimizer 101-106. Step: 127.
StepOps OneFOneB(uint64_t step) {
  StepOps s;
  s.step = step;
  s.workers = {
      {O(K::kForwardCompute, 0, 10, 0), O(K::kForwardSend, 10, 11), O(K::kBackwardRecv, 10, 57),
       O(K::kForwardCompute, 10, 20, 1), O(K::kForwardSend, 20, 27),
       O(K::kBackwardCompute, 57, 77, 0), O(K::kBackwardRecv, 77, 102),
       O(K::kBackwardCompute, 102, 122, 1), O(K::kOptimizer, 122, 127)},
      {O(K::kForwardRecv, 0, 11), O(K::kForwardCompute, 11, 26, 0),
       O(K::kBackwardCompute, 26, 56, 0), O(K::kForwardRecv, 26, 27), O(K::kBackwardSend, 56, 57),
       O(K::kForwardCompute, 56, 71, 1), O(K::kBackwardCompute, 71, 101, 1),
       O(K::kBackwardSend, 101, 102), O(K::kOptimizer, 101, 106)},
  };
  return s;
}

TEST(WhatifAnalyzer, TwoStageOneFOneBByHand) {
  Analyzer a(Layout{1, 2, 1, 1}, Options{});
  ASSERT_TRUE(a.AddStep(OneFOneB(7)).ok());
  const WindowResult r = a.Window();
  ASSERT_EQ(r.steps, 1u);
  EXPECT_EQ(r.first_step, 7u);
  // The ops are the model's own timeline: simulated = measured.
  EXPECT_DOUBLE_EQ(r.measured_us, 127 * kMs);
  EXPECT_DOUBLE_EQ(r.actual_us, 127 * kMs);
  // Ideal: forward 12.5 and backward 25 on both stages, transfers 1:
  //   s0 F0 0-12.5, F1 12.5-25; s1 F0 13.5-26, B0 26-51, F1 51-63.5, B1 63.5-88.5;
  //   s0 B0 52-77, B1 89.5-114.5, optimizer 114.5-119.5.
  EXPECT_DOUBLE_EQ(r.ideal_us, 119.5 * kMs);
  EXPECT_DOUBLE_EQ(r.slowdown, 127 / 119.5);
  EXPECT_DOUBLE_EQ(r.typical_us[static_cast<int>(K::kForwardCompute)], 12.5 * kMs);
  EXPECT_DOUBLE_EQ(r.typical_us[static_cast<int>(K::kBackwardRecv)], 1 * kMs);
  ASSERT_EQ(r.stage_compute_us.size(), 2u);
  EXPECT_DOUBLE_EQ(r.stage_compute_us[1], 90 * kMs);

  const Decomposition& d = r.decomposition;
  ASSERT_EQ(d.by_dp_rank.size(), 1u);
  EXPECT_DOUBLE_EQ(d.by_dp_rank[0], 127 / 119.5);
  ASSERT_EQ(d.by_stage.size(), 2u);
  // Stage 0 measured (10/20), stage 1 ideal: s1 B1 ends 86, s0 B1 87-107, optimizer 112.
  EXPECT_DOUBLE_EQ(d.by_stage[0], 112 / 119.5);
  // Stage 1 measured (15/30): s1 B1 73.5-103.5, s0 B1 104.5-129.5, optimizer 134.5.
  EXPECT_DOUBLE_EQ(d.by_stage[1], 134.5 / 119.5);
  auto groups = GroupsOf(d);
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_DOUBLE_EQ(groups["forward-compute"], 122 / 119.5);
  EXPECT_DOUBLE_EQ(groups["backward-compute"], 124.5 / 119.5);
  EXPECT_DOUBLE_EQ(groups["forward-pp-comm"], 1);
  EXPECT_DOUBLE_EQ(groups["backward-pp-comm"], 1);
  EXPECT_DOUBLE_EQ(groups["optimizer"], 1);
  EXPECT_EQ(d.by_op_group.front().first, "backward-compute");

  // Stage 1 is the worst and the last; with its ops ideal the step takes 112:
  // M_S = (127 - 112) / (127 - 119.5) = 2. It is also the one top worker (1 of 2).
  EXPECT_EQ(r.m_s_stage, 1u);
  EXPECT_DOUBLE_EQ(r.m_s, 2);
  EXPECT_DOUBLE_EQ(r.m_s_last, 2);
  ASSERT_EQ(r.m_w_workers, std::vector<uint32_t>{1});
  EXPECT_DOUBLE_EQ(r.m_w, 2);
  ASSERT_EQ(d.by_worker.size(), 1u);
  EXPECT_EQ(d.by_worker[0].first, 1u);
  EXPECT_DOUBLE_EQ(d.by_worker[0].second, 134.5 / 119.5);

  ASSERT_EQ(r.per_step.size(), 1u);
  EXPECT_DOUBLE_EQ(r.per_step[0].slowdown, 127 / 119.5);
  EXPECT_DOUBLE_EQ(r.per_step[0].decomposition.by_stage[1], 134.5 / 119.5);
}

// Flat data parallelism: 4 data ranks, forward 10, backward 20, then the grads all-reduce
// (synced over every rank; 5 after the last start), optimizer 1. Rank `slow` takes twice as
// long.
StepOps Ddp(uint64_t step, int slow) {
  StepOps s;
  s.step = step;
  for (int d = 0; d < 4; ++d) {
    const double f = d == slow ? 20 : 10, b = d == slow ? 40 : 20;
    const double ar_end = (slow >= 0 ? 60 : 30) + 5;
    s.workers.push_back({O(K::kForwardCompute, 0, f), O(K::kBackwardCompute, f, f + b),
                         O(K::kGradsAllReduce, f + b, ar_end),
                         O(K::kOptimizer, ar_end, ar_end + 1)});
  }
  return s;
}

TEST(WhatifAnalyzer, FlatDataParallelSlowWorker) {
  Analyzer a(Layout{4, 1, 1, 1}, Options{});
  ASSERT_TRUE(a.AddStep(Ddp(1, 2)).ok());
  const WindowResult r = a.Window();
  // Actual: rank 2 reaches the all-reduce at 60: 60 + 5 + 1 = 66. Ideal: forward 12.5,
  // backward 25, all-reduce 5, optimizer 1 = 43.5.
  EXPECT_DOUBLE_EQ(r.actual_us, 66 * kMs);
  EXPECT_DOUBLE_EQ(r.ideal_us, 43.5 * kMs);
  const Decomposition& d = r.decomposition;
  ASSERT_EQ(d.by_dp_rank.size(), 4u);
  EXPECT_DOUBLE_EQ(d.by_dp_rank[2], 66 / 43.5);
  EXPECT_DOUBLE_EQ(d.by_dp_rank[0], 1);  // rank 0's 30 hides behind the ideal 37.5
  ASSERT_EQ(r.m_w_workers, std::vector<uint32_t>{2});
  EXPECT_DOUBLE_EQ(r.m_w, 1);  // rank 2 at ideal durations: 37.5 + 5 + 1 = 43.5, all explained
  EXPECT_EQ(d.by_worker[0].first, 2u);
  EXPECT_DOUBLE_EQ(d.by_worker[0].second, 66 / 43.5);
}

TEST(WhatifAnalyzer, ABalancedJobHasNoSlowdown) {
  Analyzer a(Layout{4, 1, 1, 1}, Options{});
  for (uint64_t step = 0; step < 5; ++step) ASSERT_TRUE(a.AddStep(Ddp(step, -1)).ok());
  const WindowResult r = a.Window();
  EXPECT_EQ(r.steps, 5u);
  EXPECT_EQ(r.slowdown, 1.0);
  EXPECT_EQ(r.actual_us, r.ideal_us);
  EXPECT_TRUE(r.decomposition.empty());
  EXPECT_EQ(r.m_w, 0);
  EXPECT_EQ(r.m_s, 0);
  for (const StepResult& s : r.per_step) EXPECT_EQ(s.slowdown, 1.0);
}

TEST(WhatifAnalyzer, TheBalancedOneFOneBIsIdeal) {
  // Both stages at forward 10, backward 20, two data ranks alike, then layernorm 1, the
  // embedding all-reduce of the two stages (2 after the later start), reduce-scatter 3, clip 1
  // (every worker), optimizer 5: its own ideal. The model's timeline:
  //   s0 F0 0-10, F1 10-20, B0 42-62 (bsend0 41-42), B1 72-92 (bsend1 71-72), layernorm
  //   92-93, embedding 93-95; s1 F0 11-21, B0 21-41, F1 41-51, B1 51-71, layernorm 71-72,
  //   embedding 72-95; then both reduce-scatter 95-98, clip 98-99, optimizer 99-104.
  const std::vector<Op> s0 = {O(K::kForwardCompute, 0, 10),
                              O(K::kForwardSend, 10, 11),
                              O(K::kBackwardRecv, 10, 42),
                              O(K::kForwardCompute, 10, 20),
                              O(K::kForwardSend, 20, 22),
                              O(K::kBackwardCompute, 42, 62),
                              O(K::kBackwardRecv, 62, 72),
                              O(K::kBackwardCompute, 72, 92),
                              O(K::kLayernormGradsAllReduce, 92, 93),
                              O(K::kEmbeddingGradsAllReduce, 93, 95),
                              O(K::kGradsReduceScatter, 95, 98),
                              O(K::kOptimizerClipMainGrad, 98, 99),
                              O(K::kOptimizer, 99, 104)};
  const std::vector<Op> s1 = {O(K::kForwardRecv, 0, 11),
                              O(K::kForwardCompute, 11, 21),
                              O(K::kForwardRecv, 21, 22),
                              O(K::kBackwardCompute, 21, 41),
                              O(K::kBackwardSend, 41, 42),
                              O(K::kForwardCompute, 41, 51),
                              O(K::kBackwardCompute, 51, 71),
                              O(K::kBackwardSend, 71, 72),
                              O(K::kLayernormGradsAllReduce, 71, 72),
                              O(K::kEmbeddingGradsAllReduce, 72, 95),
                              O(K::kGradsReduceScatter, 95, 98),
                              O(K::kOptimizerClipMainGrad, 98, 99),
                              O(K::kOptimizer, 99, 104)};
  StepOps s;
  s.step = 1;
  s.workers = {s0, s0, s1, s1};
  Analyzer a(Layout{2, 2, 1, 1}, Options{});
  const absl::Status st = a.AddStep(s);
  ASSERT_TRUE(st.ok()) << st;
  const WindowResult r = a.Window();
  EXPECT_DOUBLE_EQ(r.measured_us, 104 * kMs);
  EXPECT_DOUBLE_EQ(r.actual_us, 104 * kMs);
  EXPECT_EQ(r.slowdown, 1.0);
}

// GC (an extension of the study's model): rank 1 pauses 10 ms from 8, inside its forward
// compute (0-10, so 2 of the pause are carved out of it) and delaying its backward (18-38).
TEST(WhatifAnalyzer, AGcPauseAnywhereIsItsOwnNodeInTheComputeChain) {
  StepOps s;
  s.step = 3;
  s.workers = {
      {O(K::kForwardCompute, 0, 10), O(K::kBackwardCompute, 10, 30), O(K::kGradsAllReduce, 30, 43),
       O(K::kOptimizer, 43, 44)},
      {O(K::kForwardCompute, 0, 10), O(K::kGc, 8, 18), O(K::kBackwardCompute, 18, 38),
       O(K::kGradsAllReduce, 38, 43), O(K::kOptimizer, 43, 44)},
  };
  Analyzer a(Layout{2, 1, 1, 1}, Options{});
  ASSERT_TRUE(a.AddStep(s).ok());
  const WindowResult r = a.Window();
  // Actual: rank 1 8 + 10 + 20 = 38, all-reduce 5, optimizer 1: 44. Ideal: forward (10 + 8) /
  // 2 = 9, backward 20, GC 10 / 2 workers = 5 after the last compute, all-reduce 5,
  // optimizer 1: 40.
  EXPECT_DOUBLE_EQ(r.actual_us, 44 * kMs);
  EXPECT_DOUBLE_EQ(r.typical_us[static_cast<int>(K::kGc)], 5 * kMs);
  EXPECT_DOUBLE_EQ(r.ideal_us, 40 * kMs);
  auto groups = GroupsOf(r.decomposition);
  // GC as measured: rank 1 9 + 10 + 20 = 39 -> 45.
  EXPECT_DOUBLE_EQ(groups["gc"], 45 / 40.0);
  EXPECT_EQ(r.decomposition.by_op_group.front().first, "gc");
  EXPECT_DOUBLE_EQ(groups["forward-compute"], 41 / 40.0);
  EXPECT_DOUBLE_EQ(r.decomposition.by_dp_rank[1], 44 / 40.0);
  EXPECT_DOUBLE_EQ(r.decomposition.by_dp_rank[0], 1);
}

TEST(WhatifAnalyzer, DataLoadingPrecedesComputeAndTensorParallelOpsAreIgnored) {
  StepOps s;
  s.step = 0;
  s.workers = {{O(K::kDataLoading, 0, 3), O(K::kForwardCompute, 3, 13), O(K::kTensorParallel, 5, 9),
                O(K::kBackwardCompute, 13, 33), O(K::kOptimizer, 33, 34)}};
  Analyzer a(Layout{1, 1, 1, 1}, Options{});
  ASSERT_TRUE(a.AddStep(s).ok());
  const WindowResult r = a.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, 34 * kMs);
  EXPECT_DOUBLE_EQ(r.typical_us[static_cast<int>(K::kDataLoading)], 3 * kMs);
  EXPECT_EQ(r.slowdown, 1.0);
}

TEST(WhatifAnalyzer, TheWindowKeepsTheLatestSteps) {
  Options o;
  o.window_steps = 2;
  Analyzer a(Layout{4, 1, 1, 1}, o);
  ASSERT_TRUE(a.AddStep(Ddp(10, 1)).ok());
  ASSERT_TRUE(a.AddStep(Ddp(11, -1)).ok());
  ASSERT_TRUE(a.AddStep(Ddp(12, -1)).ok());
  EXPECT_EQ(a.steps(), 2u);
  const WindowResult r = a.Window();
  EXPECT_EQ(r.first_step, 11u);
  EXPECT_EQ(r.last_step, 12u);
  EXPECT_EQ(r.slowdown, 1.0);
}

TEST(WhatifAnalyzer, ASlowReplicaThatMovesIsSeenStepByStep) {
  // Sequence imbalance: the slow data rank changes every step; each step's decomposition
  // names its own.
  Analyzer a(Layout{4, 1, 1, 1}, Options{});
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(a.AddStep(Ddp(step, step)).ok());
  const WindowResult r = a.Window();
  ASSERT_FALSE(r.decomposition.empty());
  for (int step = 0; step < 4; ++step) {
    const auto& by_dp = r.per_step[step].decomposition.by_dp_rank;
    EXPECT_EQ(std::max_element(by_dp.begin(), by_dp.end()) - by_dp.begin(), step);
  }
  // Over the window no rank explains it: each carries a quarter.
  for (double s : r.decomposition.by_dp_rank) {
    EXPECT_NEAR(s, r.decomposition.by_dp_rank[0], 1e-12);
    EXPECT_LT(s, r.slowdown);
  }
  // A second call answers the same from its caches.
  const WindowResult again = a.Window();
  EXPECT_EQ(again.decomposition.by_dp_rank, r.decomposition.by_dp_rank);
  EXPECT_EQ(again.m_w, r.m_w);
}

TEST(WhatifAnalyzer, StepsThatFitNoModelAreRejectedWithOneLine) {
  Analyzer a(Layout{1, 2, 1, 1}, Options{});
  ASSERT_TRUE(a.AddStep(OneFOneB(1)).ok());
  auto expect = [&](StepOps s, const std::string& part) {
    const absl::Status st = a.AddStep(std::move(s));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(part), std::string::npos) << st;
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st;
  };
  StepOps s = OneFOneB(2);
  s.workers.pop_back();
  expect(s, "step 2: 1 workers, the layout (dp 1 x pp 2) has 2");
  s = OneFOneB(2);
  s.workers[1].clear();
  expect(s, "data rank 0, stage 1 has no ops");
  s = OneFOneB(2);
  s.workers[0][0].duration_us = -1;
  expect(s, "forward-compute with start 0.000000 and duration -1");
  // Stage 1 lost its first forward receive: the last stage may lack one, but then stage 0's
  // two forward sends have one peer.
  s = OneFOneB(2);
  s.workers[1].erase(s.workers[1].begin());
  expect(s, "stage 0 has 2 forward-send ops with a peer, stage 1 1 forward-recv: unpaired");
  EXPECT_EQ(a.steps(), 1u);

  Analyzer b(Layout{2, 1, 1, 1}, Options{});
  StepOps two;
  two.step = 5;
  two.workers = {{O(K::kForwardCompute, 0, 1), O(K::kOptimizer, 1, 2)},
                 {O(K::kForwardCompute, 0, 1), O(K::kForwardCompute, 1, 2)}};
  const absl::Status st = b.AddStep(two);
  EXPECT_NE(
      st.message().find("data rank 1 of stage 0 has 2 forward-compute ops, data rank 0 has 1"),
      std::string::npos)
      << st;
  EXPECT_EQ(b.steps(), 0u);
}

TEST(WhatifAnalyzer, OpKindNames) {
  for (int k = 0; k < kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    EXPECT_EQ(OpKindFromName(OpKindName(kind)), kind);
  }
  EXPECT_EQ(OpKindFromName("separate-grads-all-reduce"), OpKind::kGradsAllReduce);
  EXPECT_EQ(OpKindFromName("nope"), std::nullopt);
  EXPECT_EQ(OpGroupName(OpKind::kBackwardRecv), "backward-pp-comm");
  EXPECT_EQ(OpGroupName(OpKind::kOptimizer), "optimizer");
  EXPECT_TRUE(IsCommunication(OpKind::kLayernormGradsAllReduce));
  EXPECT_FALSE(IsCommunication(OpKind::kGc));
  EXPECT_FALSE(IsModelled(OpKind::kTensorParallel));
}

}  // namespace
}  // namespace rankwatch::whatif
