// The what-if verdict of a pipeline-parallel job (docs/whatif.md, "Verdicts"): from the
// analyzer's window result (whatif.h) and simple per-stage and per-worker op statistics, says
// what kind of straggling costs the job — one slow worker, an imbalanced pipeline stage,
// sequence (data) imbalance whose slow replica moves step to step, slow communication of one
// op type, GC pauses — or that it is balanced, with the slowdown S, the rank-seconds lost, the
// culprit, a note and a next step.
//
// Pure functions and plain value types; OpStats is not thread-safe (owned by the JobPipeline
// of the job, next to its Analyzer).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "operators/severity.h"
#include "operators/whatif/whatif.h"

namespace rankwatch::whatif {

enum class Verdict : uint8_t {
  kNone,  // no what-if: fewer steps than min_steps, or no ops
  kBalanced,
  kSlowWorker,
  kStageImbalance,
  kSequenceImbalance,
  kSlowCommunication,
  kGcPauses,
  kUnattributed,  // slower than ideal, but no one group explains it
};
inline constexpr int kVerdictCount = 8;
// "none", "balanced", "slow_worker", "stage_imbalance", "sequence_imbalance",
// "slow_communication", "gc_pauses", "unattributed".
std::string_view VerdictName(Verdict v);

struct VerdictOptions {
  uint32_t min_steps = 4;       // fewer analysed steps -> kNone
  double warn_slowdown = 1.05;  // S at least this is a finding (below: balanced)
  double crit_slowdown = 1.20;
  // A group "explains" the slowdown when keeping only its measured durations brings back at
  // least this share of S - 1.
  double explain_share = 0.5;
  // Sequence imbalance: the most frequent slowest replica holds at most this share of steps.
  double moving_max_share = 0.6;
};

// Per-step op statistics the verdict needs beside the analyzer's result: each stage's mean
// compute (forward + backward) per step, each worker's mean GC time per step. Over the same
// window as the analyzer.
class OpStats {
 public:
  OpStats(Layout layout, uint32_t window_steps);
  void Add(const StepOps& step);
  uint32_t steps() const { return static_cast<uint32_t>(steps_.size()); }
  std::vector<double> StageComputeUs() const;  // size pp
  std::vector<double> WorkerGcUs() const;      // size workers
 private:
  struct Step {
    std::vector<double> stage_compute_us;
    std::vector<double> worker_gc_us;
  };
  Layout layout_;
  uint32_t window_steps_;
  std::deque<Step> steps_;
};

struct WhatIfVerdict {
  Verdict verdict = Verdict::kNone;
  Severity severity = Severity::kInfo;
  double slowdown = 1;           // S over the window
  double lost_rank_seconds = 0;  // (actual - ideal) x world size, summed over the window
  // The culprit, where the verdict has one (-1 = none): slow worker: its data rank and stage;
  // stage imbalance: the stage; GC pauses: the worker with most GC time.
  int32_t data_rank = -1;
  int32_t stage = -1;
  std::vector<uint32_t> ranks;  // the culprit's global ranks (a worker's tensor ranks)
  std::string op_group;         // slow communication: the op group; GC: "gc"
  double explained = 0;         // the share of S - 1 the culprit's group explains
  // Stage imbalance: the share of the stage's compute to move to other stages to even them.
  double move_fraction = 0;
  // Sequence imbalance: distinct slowest replicas over the window's steps.
  uint32_t moving_replicas = 0;
  std::string note;
  std::string next_step;
};

// `worker_ranks[w]`: the global ranks of worker w (index stage * dp + data rank), ascending.
WhatIfVerdict JudgeWhatIf(const WindowResult& result, const Layout& layout,
                          const std::vector<std::vector<uint32_t>>& worker_ranks,
                          const OpStats& stats, const VerdictOptions& options);

}  // namespace rankwatch::whatif
