// Memory-copy bandwidth per copy kind (docs/spec/kernel-analysis.md section 9): a step function of
// total GB/s per sub-type (Memcpy HtoD, Memcpy DtoH, Memcpy DtoD, Memset, ...), summarised over
// its positive change points (not time-weighted). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operators/kernel/describe.h"
#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct MemoryBandwidthRow {
  uint32_t rank = 0;
  std::string kind;  // memory sub-type
  Describe gbps;     // over the step function's points with value > 0
};

// Rows sorted by kind. Zero-length copies count 1 µs long, as in HTA.
std::vector<MemoryBandwidthRow> ComputeMemoryBandwidth(const RankTimeline& t);

}  // namespace rankwatch::kernel
