// Per-kernel duration statistics by kernel type with HTA's top-N folding
// (docs/spec/kernel-analysis.md section 6.2). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct KernelStatRow {
  std::string name;  // full kernel name, or "others" for the folded rest
  KernelType type = KernelType::kComputation;
  uint32_t rank = 0;
  double sum_us = 0, max_us = 0, min_us = 0, mean_us = 0;
  double std_us = 0;  // ddof 1; 0 for one sample (HTA's fillna(0))
};

struct KernelStatsOptions {
  double duration_ratio = 0.8;  // quantile of the cumulative sums beyond which names fold
  size_t num_kernels = 10;      // more distinct names than this -> fold
  bool include_memory = true;
};

// Rows for COMPUTATION, COMMUNICATION (and MEMORY) of one rank, each type's rows sorted by name.
// After folding, a surviving row's statistics are of its total (max = min = mean = sum, std 0)
// and the "others" row describes the folded per-kernel totals, exactly as HTA.
std::vector<KernelStatRow> ComputeKernelStats(const RankTimeline& t, const KernelStatsOptions& o);

}  // namespace rankwatch::kernel
