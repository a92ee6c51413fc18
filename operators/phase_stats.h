// Cross-rank statistics of each phase over a StepWindow (docs/spec/step-diagnosis.md section 2):
// per rank the per-step mean of the phase over the window, then the median over ranks, the
// worst (max) with its rank, and skew = (worst - median) / median.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "operators/step_window.h"

namespace rankwatch {

struct PhaseStat {
  bool present = false;  // at least one rank reported the phase in the window
  uint32_t ranks = 0;    // ranks that reported it
  double median_seconds = 0;
  double worst_seconds = 0;
  uint32_t worst_rank = 0;
  double skew = 0;  // 0 when the median is 0 or one rank reported
};

using PhaseStats = std::array<PhaseStat, kPhaseCount>;

PhaseStats ComputePhaseStats(const StepWindow& window);

// Median of `values` (mean of the two middle values for an even count); reorders them.
// Requires a non-empty vector.
double MedianInPlace(std::vector<double>& values);

}  // namespace rankwatch
