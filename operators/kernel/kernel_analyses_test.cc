// Hand-computed timelines for each analysis of docs/spec/kernel-analysis.md; each case breaks if a
// rule (touching intervals, compute-wins, per-stream gaps, 30 µs, folding, joins) is changed.
#include <gtest/gtest.h>

#include <cmath>

#include "operators/kernel/gpu_time_breakdown.h"
#include "operators/kernel/idle_time_breakdown.h"
#include "operators/kernel/interval_union.h"
#include "operators/kernel/kernel_duration_stats.h"
#include "operators/kernel/launch_stats.h"
#include "operators/kernel/queue_length.h"
#include "operators/kernel/timeline_builder.h"

namespace rankwatch::kernel {
namespace {

constexpr int64_t us = 1000;

struct Builder {
  StringTable strings{""};
  RankTimeline t;
  Builder() { t.strings = &strings; }
  uint32_t Id(const std::string& s) {
    for (uint32_t i = 0; i < strings.size(); ++i)
      if (strings[i] == s) return i;
    strings.push_back(s);
    return static_cast<uint32_t>(strings.size() - 1);
  }
  GpuOp& Op(const std::string& name, int64_t ts, int64_t dur, int64_t stream = 7,
            int64_t corr = -1) {
    GpuOp op;
    op.ts = ts * us;
    op.dur = dur * us;
    op.stream = stream;
    op.correlation = corr;
    op.name = Id(name);
    op.type = ClassifyKernel(name);
    op.idle_eligible = true;
    t.gpu.push_back(op);
    t.strings = &strings;
    return t.gpu.back();
  }
  CpuCall& Call(const std::string& name, int64_t ts, int64_t dur, int64_t corr) {
    CpuCall c;
    c.ts = ts * us;
    c.dur = dur * us;
    c.correlation = corr;
    c.index_correlation = 1;
    c.name = Id(name);
    c.launch_stats = IsLaunchStatsCall(name);
    c.queue_launch = IsQueueLaunchCall(name);
    t.calls.push_back(c);
    return t.calls.back();
  }
};

TEST(KernelType, HtaRules) {
  EXPECT_EQ(ClassifyKernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"),
            KernelType::kCommunication);
  EXPECT_EQ(ClassifyKernel("hipMemcpyAsync"), KernelType::kCommunication);  // hip* is COMM first
  EXPECT_EQ(ClassifyKernel("Memcpy DtoD (Device -> Device)"), KernelType::kMemory);
  EXPECT_EQ(ClassifyKernel("void foo_dmaCopy()"), KernelType::kOther);
  EXPECT_EQ(ClassifyKernel("Stream Wait Event"), KernelType::kOther);
  EXPECT_EQ(ClassifyKernel("triton__0d1d2d"), KernelType::kComputation);
  EXPECT_EQ(MemorySubtype("Memcpy HtoD (Pageable -> Device)"), "Memcpy HtoD");
  EXPECT_EQ(MemorySubtype("MemcpyX"), "MemcpyX");
  EXPECT_EQ(IterationStepNumber("ProfilerStep # 12"), 12);
  EXPECT_FALSE(ProfilerStepNumber("ProfilerStep # 12").has_value());
}

TEST(IntervalUnion, TouchingIntervalsMerge) {
  auto m = MergeIntervals({{10, 20}, {20, 30}, {31, 40}, {12, 15}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(UnionLength(m), 29);
  EXPECT_EQ(IntersectionLength(m, MergeIntervals({{25, 35}})), 9);
}

TEST(TemporalBreakdown, ComputeWinsAndSyncIsBusyOnlyInHtaMode) {
  Builder b;
  b.Op("gemm", 0, 10);
  b.Op("ncclKernel_AllReduce", 5, 10, 9);     // 5 µs overlapped by compute, 5 alone
  b.Op("Stream Sync", 20, 5).is_sync = true;  // OTHER, busy in HTA mode
  b.Op("gemm", 30, 10);
  auto hta = ComputeTemporalBreakdown(b.t, AnalysisMode::kHtaCompat);
  EXPECT_EQ(hta.kernel_ns, 40 * us);
  EXPECT_EQ(hta.compute_ns, 20 * us);
  EXPECT_EQ(hta.idle_ns, 10 * us);  // 15-20 and 25-30
  EXPECT_EQ(hta.non_compute_ns, 10 * us);
  auto fixed = ComputeTemporalBreakdown(b.t, AnalysisMode::kCorrected);
  EXPECT_EQ(fixed.idle_ns, 15 * us);
  auto overlap = ComputeCommCompOverlap(b.t);
  EXPECT_DOUBLE_EQ(overlap.ratio(), 0.5);
  auto types = ComputeKernelTypeTime(b.t);
  ASSERT_EQ(types.size(), 3u);
  EXPECT_EQ(types[0], std::make_pair(std::string("COMPUTATION"), 15 * us));
  EXPECT_EQ(types[1], std::make_pair(std::string("COMPUTATION overlapping COMMUNICATION"), 5 * us));
  EXPECT_EQ(types[2], std::make_pair(std::string("COMMUNICATION"), 5 * us));
}

TEST(IdleTimeBreakdown, HostWaitThenThirtyMicrosecondRule) {
  Builder b;
  b.Op("k0", 0, 10);
  b.Op("k1", 50, 10).runtime_ts = 20 * us;  // launched after k0 ended: host wait 40
  b.Op("k2", 89, 1).runtime_ts = 30 * us;   // gap 29 < 30: kernel wait
  b.Op("k3", 120, 5).runtime_ts = 40 * us;  // gap 30: other
  b.Op("k4", 122, 5).runtime_ts = 40 * us;  // overlaps k3: negative gap, kernel wait
  b.Op("x", 0, 5, 9);                       // single-kernel stream: ratio NaN
  auto rows = ComputeIdleTimeBreakdown(b.t);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].category, IdleCategory::kHostWait);
  EXPECT_DOUBLE_EQ(rows[0].idle_us, 40);
  EXPECT_EQ(rows[1].category, IdleCategory::kKernelWait);
  EXPECT_DOUBLE_EQ(rows[1].idle_us, 29 - 3);
  EXPECT_DOUBLE_EQ(rows[1].gaps_us.count, 2);
  EXPECT_EQ(rows[2].category, IdleCategory::kOther);
  EXPECT_DOUBLE_EQ(rows[2].idle_us, 30);
  EXPECT_DOUBLE_EQ(rows[2].gaps_us.count, 1);  // the first kernel's NaN is not counted
  EXPECT_EQ(rows[3].stream, 9);
  EXPECT_TRUE(std::isnan(rows[3].ratio));
}

TEST(KernelStats, FoldsBeyondNumKernelsAndByCumulativeQuantile) {
  Builder b;
  for (int k = 0; k < 4; ++k) b.Op("k" + std::to_string(k), k * 100, 40 - 10 * k);  // 40,30,20,10
  b.Op("k0", 500, 20);  // k0: two launches, 60 total
  KernelStatsOptions o;
  auto unfolded = ComputeKernelStats(b.t, o);
  ASSERT_EQ(unfolded.size(), 4u);
  EXPECT_EQ(unfolded[0].name, "k0");
  EXPECT_DOUBLE_EQ(unfolded[0].sum_us, 60);
  EXPECT_DOUBLE_EQ(unfolded[0].std_us, std::sqrt(200.0));
  o.num_kernels = 2;  // sums 60,30,20,10; cumsum 60,90,110,120; q80 = 114
  auto folded = ComputeKernelStats(b.t, o);
  ASSERT_EQ(folded.size(), 3u);
  EXPECT_EQ(folded[0].name, "k0");
  EXPECT_DOUBLE_EQ(folded[0].max_us, 60);  // statistics of its total
  EXPECT_EQ(folded[2].name, "others");
  EXPECT_DOUBLE_EQ(folded[2].sum_us, 30);
  EXPECT_DOUBLE_EQ(folded[2].mean_us, 15);
}

TEST(LaunchStats, JoinOnCorrelationAndDiagnoses) {
  Builder b;
  b.Call("cudaLaunchKernel", 0, 10, 1);
  b.Op("k", 200, 5, 7, 1);  // delay 190 > 100; short kernel (5 < 10)
  b.Call("cuLaunchKernel", 0, 60, 2);
  b.Op("k", 70, 5, 7, 2);  // driver API: not in the launch set
  b.Call("cudaMemcpyAsync", 0, 60, 3);
  b.Op("Memcpy HtoD", 50, 5, 7, 3);  // kernel started before the call ended: delay 0
  auto rows = ComputeLaunchRows(b.t);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].launch_delay_us, 190);
  EXPECT_DOUBLE_EQ(rows[1].launch_delay_us, 0);
  auto s = SummarizeLaunches(rows, {});
  EXPECT_EQ(s.short_kernels, 1u);
  EXPECT_EQ(s.runtime_outliers, 1u);
  EXPECT_EQ(s.launch_delay_outliers, 1u);
}

TEST(QueueLength, LaunchesMinusStartsPerStream) {
  Builder b;
  b.Call("cudaLaunchKernel", 0, 1, 1);
  b.Call("cudaLaunchKernel", 1, 1, 2);
  b.Op("a", 5, 10, 7, 1);
  b.Op("b", 15, 10, 7, 2);
  b.t.min_ts = 0;
  b.t.max_ts = 15 * us;
  auto q = ComputeQueueLength(b.t, 2);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_DOUBLE_EQ(q[0].queue_length.count, 4);  // 1, 2, 1, 0
  EXPECT_DOUBLE_EQ(q[0].queue_length.mean, 1);
  EXPECT_DOUBLE_EQ(q[0].queue_length.max, 2);
  EXPECT_DOUBLE_EQ(q[0].blocked_us, 4);  // from 1 to 5 µs at length 2
}

TEST(TimelineBuilder, DropsLastStepKeepsLaunchedKernelsAndRoundsNs) {
  RankTrace r;
  r.strings = {"",
               "ProfilerStep#1",
               "ProfilerStep#2",
               "user_annotation",
               "cudaLaunchKernel",
               "cuda_runtime",
               "k",
               "kernel"};
  r.ts_is_float = true;
  r.events = {
      {100'000, 100'000, -1, -1, -1, 0, 1, 3, 0},  // step 1 [100, 200)
      {200'000, 100'000, -1, -1, -1, 0, 2, 3, 1},  // step 2: the last, dropped
      {150'000, 5'000, -1, 11, -1, 0, 4, 5, 2},    // launch in step 1
      {250'700, 200, 7, 11, -1, 0, 6, 7, 3},       // runs in step 2; ts 250.7 dur 0.2 -> dur -1
      {210'000, 5'000, -1, 12, -1, 0, 4, 5, 4},    // launch in step 2: dropped with its kernel
      {260'000, 1'000, 7, 12, -1, 0, 6, 7, 5},
  };
  auto job = BuildTimelines({r}, {.mode = AnalysisMode::kHtaCompat});
  ASSERT_EQ(job.ranks.size(), 1u);
  const auto& t = job.ranks[0];
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.gpu[0].ts, (251 - 100) * us);  // ceil, aligned to the first event
  EXPECT_EQ(t.gpu[0].dur, -1 * us);          // floor(250.9) - ceil(250.7)
  EXPECT_EQ(t.gpu[0].iteration, 1);
  EXPECT_EQ(t.gpu[0].index_correlation, 2);
  EXPECT_EQ(t.gpu[0].runtime_ts, 50 * us);
  EXPECT_EQ(job.profiler_steps, std::vector<int64_t>{1});
  auto fixed = BuildTimelines({r}, {.mode = AnalysisMode::kCorrected});
  EXPECT_EQ(fixed.ranks[0].gpu.size(), 2u);  // nothing dropped by step; exact ns keep dur > 0
  EXPECT_EQ(fixed.steps.size(), 2u);
}

}  // namespace
}  // namespace rankwatch::kernel
