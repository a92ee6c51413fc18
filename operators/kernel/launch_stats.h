// CUDA kernel launch statistics (docs/spec/kernel-analysis.md section 8): each launch call of the
// launch set joined with its GPU op on the correlation id; CPU duration, GPU duration and
// launch delay, and the three diagnoses (short kernels, runtime outliers, launch-delay
// outliers). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct LaunchRow {
  int64_t correlation = 0;
  double cpu_duration_us = 0;
  double gpu_duration_us = 0;
  double launch_delay_us = 0;  // max(0, kernel start − launch call end)
};

struct LaunchStatsOptions {
  double runtime_cutoff_us = 50;
  double launch_delay_cutoff_us = 100;
};

struct LaunchSummary {
  uint64_t launches = 0;
  uint64_t short_kernels = 0;                               // cpu <= runtime_cutoff and gpu < cpu
  uint64_t runtime_outliers = 0;                            // cpu > runtime_cutoff
  uint64_t launch_delay_outliers = 0;                       // delay > launch_delay_cutoff
  double cpu_mean_us, cpu_p50_us, gpu_mean_us, gpu_p50_us;  // NaN without launches
  double delay_mean_us, delay_p50_us, delay_max_us;
};

// The joined rows, sorted by correlation.
std::vector<LaunchRow> ComputeLaunchRows(const RankTimeline& t);

LaunchSummary SummarizeLaunches(const std::vector<LaunchRow>& rows, const LaunchStatsOptions& o);

}  // namespace rankwatch::kernel
