// The compute order of one pipeline rank under torch.distributed.pipelining's multi-chunk and
// zero-bubble schedules: which model chunk, which microbatch and what work — a forward, a
// full backward, or a backward split into its input-gradient part (I, sent on at once) and its
// weight-gradient part (W, placed later to fill bubbles). Reimplemented from the schedules'
// descriptions (Narayanan et al. 2021 for interleaved 1F1B; Qi et al. 2024, "Zero Bubble
// Pipeline Parallelism", for ZB1P, ZB-H1 and ZB-V; DeepSeek-V3's DualPipeV) as PyTorch 2.13
// orders them, and checked against PyTorch's test artifacts (pipeline_schedule_test).
//
// Pure functions. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace rankwatch {

enum class PipelineScheduleKind : uint8_t {
  k1F1B,             // Megatron-LM's non-interleaved 1F1B (one chunk per stage)
  kInterleaved1F1B,  // torch's ScheduleInterleaved1F1B, Megatron's interleaved schedule
  kZeroBubble,       // torch's ScheduleInterleavedZeroBubble (ZB1P); one chunk per stage: ZB-H1
  kZbv,              // torch's ScheduleZBVZeroBubble: two chunks per stage in a V
  kDualPipeV,        // torch's ScheduleDualPipeV: two chunks in a V, forwards and backwards paired
};

// "1f1b", "interleaved", "zb", "zbv", "dualpipev".
std::string_view PipelineScheduleName(PipelineScheduleKind kind);
bool ParsePipelineScheduleName(std::string_view name, PipelineScheduleKind* kind);

// Whether the schedule places a stage's two chunks in a V (chunk 0 on the way down, stage
// s = global chunk s; chunk 1 on the way back, global chunk 2 * pp - 1 - s), rather than in a
// loop (chunk c of stage s = global chunk c * pp + s).
bool IsVShaped(PipelineScheduleKind kind);

enum class ComputeWork : uint8_t {
  kForward,
  kBackward,        // the full backward
  kBackwardInput,   // the input-gradient part (torch's BACKWARD_INPUT, "I")
  kBackwardWeight,  // the weight-gradient part (torch's BACKWARD_WEIGHT, "W")
};

struct ComputeAction {
  ComputeWork work = ComputeWork::kForward;
  uint32_t chunk = 0;  // the stage's local model chunk
  uint32_t microbatch = 0;
  bool operator==(const ComputeAction&) const = default;
};

// The compute actions of `stage` (0 .. pp - 1) in the order it runs them, for `microbatches`
// microbatches and `chunks` model chunks per stage. Requires a schedule other than k1F1B and
// sizes its ParsePipelineSpec accepts (pipeline_schedule.h): interleaved chunks >= 2, zero
// bubble chunks >= 1, both with microbatches a multiple of max(1, microbatches / pp); ZBV and
// DualPipeV chunks == 2, pp >= 2, DualPipeV microbatches >= 2 * pp.
std::vector<ComputeAction> RankComputeOrder(PipelineScheduleKind kind, uint32_t pp, uint32_t chunks,
                                            uint32_t microbatches, uint32_t stage);

}  // namespace rankwatch
