// The live kernel results of one training job: a compact summary of each analysed (rank, step)
// window, each rank's totals over its recent windows, the job-level aggregates the daemon
// exports as metrics, and the ranks whose GPU time stands apart from the others.
//
// Plain values; SummarizeJob is a pure function (thread-safe). A KernelJobSnapshot is immutable
// once published (serving/ reads it through KernelSnapshotStore).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "operators/kernel/kernel_report.h"

namespace rankwatch::kernel {

// The numbers of one (rank, step) window that the live path keeps; the same quantities
// `rankwatch analyze --format json` prints per step (corrected mode).
struct KernelStepSummary {
  uint32_t rank = 0;
  int64_t step = -1;
  uint64_t gpu_ops = 0;
  int64_t kernel_ns = 0;  // first GPU start to last GPU end
  int64_t idle_ns = 0;
  int64_t compute_ns = 0;
  int64_t non_compute_ns = 0;
  int64_t comm_ns = 0;          // union of communication kernels
  int64_t comm_overlap_ns = 0;  // of which overlapped by computation
  // Idle-time breakdown summed over streams (spec 5), µs: host wait, kernel wait, other.
  double idle_us[3] = {0, 0, 0};
  // Kernel-type time (spec 6.1), ns per label ("COMPUTATION", "COMPUTATION overlapping ...").
  std::vector<std::pair<std::string, int64_t>> kernel_type_ns;
  uint64_t launches = 0;
  uint64_t short_kernels = 0;
  uint64_t runtime_outliers = 0;
  uint64_t launch_delay_outliers = 0;
  // Launch delay quantiles over the window's launches, µs (linear interpolation); NaN without.
  double delay_p50_us = 0, delay_p90_us = 0, delay_p99_us = 0, delay_max_us = 0;

  double comm_comp_overlap_ratio() const;  // NaN without communication (as HTA)
};

KernelStepSummary SummarizeStep(const RankKernelReport& report);

// One rank over its recent closed steps (the job's window): sums of the step windows.
struct RankKernelSummary {
  uint32_t rank = 0;
  uint32_t steps = 0;  // closed steps in the window
  int64_t first_step = -1, last_step = -1;
  uint64_t steps_closed_total = 0;        // since the job was first seen
  KernelStepSummary total;                // sums over the window's steps (quantiles: max over them)
  double idle_share = 0;                  // Σ idle / Σ kernel time
  double comm_share = 0;                  // Σ communication / Σ kernel time
  std::vector<KernelStepSummary> recent;  // the window's steps, oldest first
};

// A rank whose idle or communication share of GPU time stands apart from the job's median.
struct KernelOutlier {
  uint32_t rank = 0;
  std::string signal;  // "idle" or "communication"
  double share = 0;    // the rank's share of its GPU time
  double median = 0;   // median share across ranks
  std::string note;    // one readable line
};

struct KernelOutlierOptions {
  // A rank stands apart when its share differs from the median across ranks by at least
  // `min_difference` (absolute, fraction of GPU time; default 0.10 = 10 points) and by at
  // least `mad_multiple` median absolute deviations (default 3). Needs `min_ranks` ranks
  // (default 3: with two ranks neither is "apart" from the other).
  double min_difference = 0.10;
  double mad_multiple = 3.0;
  uint32_t min_ranks = 3;
};

struct KernelJobSnapshot {
  std::string training_job;
  uint32_t world_size = 0;
  std::vector<RankKernelSummary> ranks;  // ranks with at least one closed step, by rank
  // Job-level aggregates over every rank's window (0 when there is no GPU time).
  double gpu_idle_ratio = 0, gpu_compute_ratio = 0, gpu_non_compute_ratio = 0;
  double idle_host_wait_ratio = 0, idle_kernel_wait_ratio = 0, idle_other_ratio = 0;
  std::vector<std::pair<std::string, double>> kernel_type_ratio;  // label -> share of Σ labels
  bool has_overlap = false;                                       // some rank has communication
  double overlap_median = 0, overlap_min = 0, overlap_max = 0;    // across ranks with communication
  bool has_launches = false;
  // Launch delay, seconds: median over the (rank, step) windows of each window's p50 / p90 /
  // p99, and the largest delay of all.
  double delay_p50_s = 0, delay_p90_s = 0, delay_p99_s = 0, delay_max_s = 0;
  std::vector<KernelOutlier> outliers;  // the largest deviation first
  // Input accounting since the job was first seen.
  uint64_t events_accepted = 0, events_late = 0, events_unstepped = 0, events_over_limit = 0;
  uint64_t steps_closed = 0;

  // The summary of `rank`, or nullptr (for gRPC's per-rank detail).
  const RankKernelSummary* Rank(uint32_t rank) const;
};

// Job-level aggregates and outliers from per-rank windows of closed steps.
void SummarizeJob(const KernelOutlierOptions& options, KernelJobSnapshot* snapshot);

}  // namespace rankwatch::kernel
