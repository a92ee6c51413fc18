// Turns the raw events of every rank of a job into RankTimelines, the way HTA loads traces
// (docs/spec/kernel-analysis.md section 1): ns-rounding of fractional traces, the "Trace" span
// dropped, CPU<->GPU correlation (index_correlation), one common time origin for all ranks,
// the ProfilerStep filter (last step dropped) and each event's iteration. In corrected mode
// nothing is dropped by step: events with dur < 0 are dropped instead, and the timelines are
// also split into per-step windows by the step of each operation's launch.
//
// Pure function of its input; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operators/kernel/rank_timeline.h"
#include "operators/kernel/trace_event.h"

namespace rankwatch::kernel {

struct TimelineOptions {
  AnalysisMode mode = AnalysisMode::kCorrected;
  // HTA's include_last_profiler_step (compat mode only). Default false: the last step is dropped.
  bool include_last_profiler_step = false;
  // Also build one timeline per (rank, step).
  bool per_step = true;
};

struct JobTimelines {
  // One per input rank, in input order: the whole trace (after HTA's filter in compat mode).
  std::vector<RankTimeline> ranks;
  // Per (rank, step) windows, ordered by rank then step; GPU ops by their launch's step.
  std::vector<RankTimeline> steps;
  // HTA's get_profiler_steps(): step numbers of the ProfilerStep events left after filtering.
  std::vector<int64_t> profiler_steps;
  int64_t min_ts_ns = 0;  // the common origin subtracted from every timestamp
  std::vector<std::string> warnings;
};

// `traces` must outlive the result (timelines point at their string tables).
JobTimelines BuildTimelines(const std::vector<RankTrace>& traces, const TimelineOptions& options);

}  // namespace rankwatch::kernel
