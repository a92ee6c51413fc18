// How a rank's GPU time splits, from interval unions over all streams
// (docs/spec/kernel-analysis.md sections 4, 6.1 and 7): temporal breakdown (idle / compute /
// non-compute), kernel-type time with overlap combinations, and communication/computation
// overlap. Pure functions of a RankTimeline; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct TemporalBreakdown {
  int64_t idle_ns = 0;
  int64_t compute_ns = 0;
  int64_t non_compute_ns = 0;
  int64_t kernel_ns = 0;  // first GPU start to last GPU end
  bool empty = true;      // no GPU event at all
};

// Spec 4. HTA mode counts every event with a stream as busy; corrected mode leaves sync
// events (Stream Sync, Stream Wait Event) out of the busy union.
TemporalBreakdown ComputeTemporalBreakdown(const RankTimeline& t, AnalysisMode mode);

// Spec 6.1: time per combination label ("COMPUTATION overlapping COMMUNICATION", ...), ns.
// Labels appear in first-seen order; zero-length labels can appear, as in HTA.
std::vector<std::pair<std::string, int64_t>> ComputeKernelTypeTime(const RankTimeline& t,
                                                                   bool include_memory = true);

struct CommCompOverlap {
  int64_t comm_ns = 0;     // |union of COMMUNICATION|
  int64_t overlap_ns = 0;  // |COMM ∩ COMP|
  double ratio() const;    // overlap / comm; NaN without communication (as HTA)
};

// Spec 7.
CommCompOverlap ComputeCommCompOverlap(const RankTimeline& t);

}  // namespace rankwatch::kernel
