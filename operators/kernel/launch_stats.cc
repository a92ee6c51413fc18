#include "operators/kernel/launch_stats.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "operators/kernel/describe.h"

namespace rankwatch::kernel {

std::vector<LaunchRow> ComputeLaunchRows(const RankTimeline& t) {
  absl::flat_hash_set<int64_t> launch_ids;
  for (const CpuCall& c : t.calls) {
    if (c.launch_stats) launch_ids.insert(c.correlation);
  }
  absl::flat_hash_map<int64_t, std::vector<const GpuOp*>> gpu;
  for (const GpuOp& op : t.gpu) {
    if (launch_ids.contains(op.correlation)) gpu[op.correlation].push_back(&op);
  }
  std::vector<LaunchRow> rows;
  for (const CpuCall& c : t.calls) {
    if (!launch_ids.contains(c.correlation)) continue;
    auto it = gpu.find(c.correlation);
    if (it == gpu.end()) continue;
    for (const GpuOp* op : it->second) {
      LaunchRow r;
      r.correlation = c.correlation;
      r.cpu_duration_us = static_cast<double>(c.dur) / 1000.0;
      r.gpu_duration_us = static_cast<double>(op->dur) / 1000.0;
      r.launch_delay_us =
          static_cast<double>(std::max<int64_t>(0, op->ts - (c.ts + c.dur))) / 1000.0;
      rows.push_back(r);
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const LaunchRow& a, const LaunchRow& b) {
    return a.correlation < b.correlation;
  });
  return rows;
}

LaunchSummary SummarizeLaunches(const std::vector<LaunchRow>& rows, const LaunchStatsOptions& o) {
  LaunchSummary s;
  std::vector<double> cpu, gpu, delay;
  for (const LaunchRow& r : rows) {
    ++s.launches;
    s.short_kernels +=
        r.cpu_duration_us <= o.runtime_cutoff_us && r.gpu_duration_us < r.cpu_duration_us;
    s.runtime_outliers += r.cpu_duration_us > o.runtime_cutoff_us;
    s.launch_delay_outliers += r.launch_delay_us > o.launch_delay_cutoff_us;
    cpu.push_back(r.cpu_duration_us);
    gpu.push_back(r.gpu_duration_us);
    delay.push_back(r.launch_delay_us);
  }
  const Describe dc = DescribeSample(cpu), dg = DescribeSample(gpu), dd = DescribeSample(delay);
  s.cpu_mean_us = dc.mean;
  s.cpu_p50_us = dc.p50;
  s.gpu_mean_us = dg.mean;
  s.gpu_p50_us = dg.p50;
  s.delay_mean_us = dd.mean;
  s.delay_p50_us = dd.p50;
  s.delay_max_us = dd.max;
  return s;
}

}  // namespace rankwatch::kernel
