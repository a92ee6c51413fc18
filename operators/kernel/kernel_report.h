// Every kernel analysis of one rank over one window (the whole trace, or one step): the value
// `rankwatch analyze` prints and the live path exports. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "operators/kernel/gpu_time_breakdown.h"
#include "operators/kernel/idle_time_breakdown.h"
#include "operators/kernel/kernel_duration_stats.h"
#include "operators/kernel/launch_stats.h"
#include "operators/kernel/memory_bandwidth.h"
#include "operators/kernel/queue_length.h"
#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct KernelAnalysisOptions {
  AnalysisMode mode = AnalysisMode::kCorrected;
  int64_t consecutive_kernel_delay_ns = 30'000;  // idle breakdown: kernel wait below this
  KernelStatsOptions kernel_stats;               // top-N folding (10 names, ratio 0.8)
  LaunchStatsOptions launch;                     // cutoffs 50 µs / 100 µs
  int64_t max_queue_length = 1024;
  bool keep_launch_rows = true;  // false: only the summary (the live path)
};

struct RankKernelReport {
  uint32_t rank = 0;
  int64_t step = -1;  // -1: whole trace
  uint64_t gpu_ops = 0;
  TemporalBreakdown temporal;
  std::vector<IdleRow> idle;
  std::vector<std::pair<std::string, int64_t>> kernel_type_ns;
  std::vector<KernelStatRow> kernels;      // folded (HTA's default num_kernels)
  std::vector<KernelStatRow> kernels_all;  // not folded
  CommCompOverlap overlap;
  std::vector<LaunchRow> launches;
  LaunchSummary launch_summary;
  std::vector<QueueLengthRow> queue;
  std::vector<MemoryBandwidthRow> memory;
  // Σ duration of communication kernels (their union): what the step diagnosis uses to find the
  // rank the others wait for.
  int64_t comm_ns() const { return overlap.comm_ns; }
};

RankKernelReport AnalyzeRank(const RankTimeline& t, const KernelAnalysisOptions& o);

}  // namespace rankwatch::kernel
