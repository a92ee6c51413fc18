// Which events of each rank's trace belong to which ProfilerStep, by the rule of the corrected
// mode's per-step windows (docs/spec/kernel-analysis.md section 11): a CPU call belongs to the step
// whose span contains it, a GPU op to the step of its launch, and each step's ProfilerStep
// markers to that step. This is what a collector tags each streamed kernel event with, so that
// the daemon's per-(rank, step) analysis sees exactly the window `rankwatch analyze` sees.
// Events outside every step are in no list.
//
// Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "operators/kernel/trace_event.h"

namespace rankwatch::kernel {

struct StepEvents {
  int64_t step = -1;
  std::vector<uint32_t> events;  // positions in RankTrace::events, ascending (trace order)
};

// One list per trace (in input order), each with its steps ascending. Steps without any GPU op
// or CPU call (no window in the analyses) are left out.
std::vector<std::vector<StepEvents>> SplitEventsBySteps(const std::vector<RankTrace>& traces);

}  // namespace rankwatch::kernel
