#include "operators/kernel/kernel_report.h"

#include <limits>

namespace rankwatch::kernel {

RankKernelReport AnalyzeRank(const RankTimeline& t, const KernelAnalysisOptions& o) {
  RankKernelReport r;
  r.rank = t.rank;
  r.step = t.step;
  r.gpu_ops = t.gpu.size();
  r.temporal = ComputeTemporalBreakdown(t, o.mode);
  r.idle = ComputeIdleTimeBreakdown(t, o.consecutive_kernel_delay_ns);
  r.kernel_type_ns = ComputeKernelTypeTime(t, o.kernel_stats.include_memory);
  r.kernels = ComputeKernelStats(t, o.kernel_stats);
  KernelStatsOptions all = o.kernel_stats;
  all.num_kernels = std::numeric_limits<size_t>::max();
  r.kernels_all = ComputeKernelStats(t, all);
  r.overlap = ComputeCommCompOverlap(t);
  std::vector<LaunchRow> launches = ComputeLaunchRows(t);
  r.launch_summary = SummarizeLaunches(launches, o.launch);
  if (o.keep_launch_rows) r.launches = std::move(launches);
  r.queue = ComputeQueueLength(t, o.max_queue_length);
  r.memory = ComputeMemoryBandwidth(t);
  return r;
}

}  // namespace rankwatch::kernel
