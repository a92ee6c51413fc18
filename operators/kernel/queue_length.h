// Launch-queue length per stream (docs/spec/kernel-analysis.md section 10): +1 when a launch call
// starts (on the stream of its GPU op), −1 when that op starts; summary statistics of the
// running value per stream (one sample per change, not time-weighted) and the time spent with
// the queue at or above `max_queue_length`. Pure; thread-safe.
//
// Tie rule (HTA's sort is unstable): at equal timestamps, launches count before op starts.
#pragma once

#include <cstdint>
#include <vector>

#include "operators/kernel/describe.h"
#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct QueueLengthRow {
  uint32_t rank = 0;
  int64_t stream = 0;
  Describe queue_length;
  double blocked_us = 0;     // time with queue_length >= max_queue_length
  double blocked_ratio = 0;  // blocked_us / (rank's last − first event start)
};

// Rows sorted by stream.
std::vector<QueueLengthRow> ComputeQueueLength(const RankTimeline& t,
                                               int64_t max_queue_length = 1024);

}  // namespace rankwatch::kernel
