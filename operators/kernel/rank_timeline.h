// A rank's timeline as the kernel analyses see it, for the whole trace or for one step: the GPU
// operations (events with a stream) and the CPU calls that carry a correlation id (runtime and
// driver API calls), linked both ways. Built by TimelineBuilder (HTA's loading pipeline, spec
// section 1) or filled incrementally by StepTimelineAccumulator for the live path.
//
// Plain value; not thread-safe to mutate. Times are ns on the analysis clock.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "operators/kernel/kernel_type.h"
#include "operators/kernel/trace_event.h"

namespace rankwatch::kernel {

inline constexpr int64_t kNoTime = std::numeric_limits<int64_t>::min();
// HTA leaves the iteration of stream-0 non-cpu_op rows undefined (NaN).
inline constexpr int64_t kNoIteration = std::numeric_limits<int64_t>::min();

enum class AnalysisMode : uint8_t {
  kCorrected,  // per-step windows, sync not busy, dur < 0 dropped (spec header)
  kHtaCompat,  // every HTA rule and quirk
};

struct GpuOp {
  int64_t ts = 0;
  int64_t dur = 0;
  int64_t stream = 0;
  int64_t correlation = -1;
  int64_t index_correlation = -1;  // >0 linked row's index, 0 unlinked, -1 no correlation
  int64_t runtime_ts = kNoTime;    // start of the launching CPU call, when known
  int64_t iteration = -1;          // ProfilerStep of the launch; -1 none
  double memory_bw_gbps = 0;
  uint32_t name = 0;
  uint32_t category = 0;
  uint32_t index = 0;
  KernelType type = KernelType::kOther;
  bool idle_eligible = false;  // kernel / memcpy / memset category (spec 1.6)
  bool is_sync = false;        // cuda_sync events (Stream Sync, Stream Wait Event, ...)

  int64_t end() const { return ts + dur; }
};

struct CpuCall {
  int64_t ts = 0;
  int64_t dur = 0;
  int64_t correlation = -1;
  int64_t index_correlation = -1;
  int64_t iteration = -1;
  uint32_t name = 0;
  uint32_t index = 0;
  bool launch_stats = false;  // cudaLaunchKernel & co (spec 8)
  bool queue_launch = false;  // enqueues on a stream (spec 10)
};

struct RankTimeline {
  uint32_t rank = 0;
  int64_t step = -1;  // -1: the whole (filtered) trace
  const StringTable* strings = nullptr;
  std::vector<GpuOp> gpu;      // events with stream != -1, in HTA's row order
  std::vector<CpuCall> calls;  // stream == -1 events with a correlation id, in row order
  int64_t min_ts = 0;          // over every kept event of the rank (queue blocked-time ratio)
  int64_t max_ts = 0;
};

}  // namespace rankwatch::kernel
