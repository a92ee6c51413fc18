// The input of the kernel-timeline operators: one complete event of a rank's GPU/CPU timeline
// (a Kineto `ph:"X"` event, or a streamed v1::KernelEvent) with the fields the analyses of
// docs/spec/kernel-analysis.md use, and the table its string ids point into.
//
// Plain values; not thread-safe to mutate. Times are integer nanoseconds on the trace's clock.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rankwatch::kernel {

struct TraceEvent {
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  int64_t stream = -1;       // -1 for CPU-side events
  int64_t correlation = -1;  // launch <-> GPU op link, -1 when absent
  int64_t bytes = -1;
  double memory_bw_gbps = 0;
  uint32_t name = 0;      // id into the rank's StringTable
  uint32_t category = 0;  // id into the rank's StringTable
  uint32_t index = 0;     // position in the source trace (HTA's row label)
};

// The strings of one rank's events, by id; id 0 is "".
using StringTable = std::vector<std::string>;

// One rank's events as read from a trace file.
struct RankTrace {
  uint32_t rank = 0;
  StringTable strings;
  std::vector<TraceEvent> events;  // in trace order
  bool ts_is_float = false;        // HTA's ns-rounding applies (spec 1.2 step 3)
  std::string backend;             // distributedInfo.backend ("nccl", "mtia:hccl", ...)
};

}  // namespace rankwatch::kernel
