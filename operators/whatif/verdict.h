// The what-if verdict of a pipeline-parallel job (docs/whatif.md, "Verdicts"): from the
// analyzer's window result (whatif.h) and simple per-stage and per-worker op statistics, says
// what kind of straggling costs the job — one slow worker, an imbalanced pipeline stage,
// sequence (data) imbalance whose slow replica moves step to step, slow communication of one
// op type, GC pauses — or that it is balanced, or slower than ideal with no one group to blame
// (unattributed), with the slowdown S, the rank-seconds lost, the culprit, a note and a next
// step.
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
  // Slower than ideal, but no one group explains it (noise, contention): severity info, no
  // alert, unless S reaches crit_slowdown.
  kUnattributed,
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
  // Stage imbalance needs the stage's compute at least this much above the stages' mean (a
  // stage that explains the slowdown without more work is slow for another reason).
  double min_stage_excess = 0.05;
  // Sequence imbalance: the most frequent slowest replica holds at most this share of steps.
  double moving_max_share = 0.8;
  // Hysteresis (VerdictHold): a held finding ends only when S falls below exit_slowdown (a
  // finding begins at warn_slowdown), a held critical severity below crit_exit_slowdown, and
  // the held verdict's group keeps explaining while it brings back keep_share of S - 1 (a new
  // group needs explain_share).
  double exit_slowdown = 1.03;
  double crit_exit_slowdown = 1.15;
  double keep_share = 0.35;
  // A verdict other than the held one (another kind, culprit or op group) replaces it only
  // once it was judged over this many consecutive analysed steps. 0: at once.
  uint32_t hold_steps = 16;
};

// Per-step op statistics the verdict needs beside the analyzer's result: each stage's mean
// compute (forward + backward, zero-bubble weight-gradient ops included) per step, each
// worker's mean GC time per step. Over the same window as the analyzer.
class OpStats {
 public:
  OpStats(Layout layout, uint32_t window_steps);
  void Add(const StepOps& step);
  uint32_t steps() const { return static_cast<uint32_t>(steps_.size()); }
  std::vector<double> StageComputeUs() const;   // size pp
  std::vector<double> WorkerGcUs() const;       // size workers
  std::vector<double> WorkerComputeUs() const;  // size workers: forward + backward (+ weight)
 private:
  struct Step {
    std::vector<double> stage_compute_us;
    std::vector<double> worker_gc_us;
    std::vector<double> worker_compute_us;
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
// `held`: the verdict a VerdictHold holds now (null: none, as offline): the thresholds that keep
// it are the options' exit thresholds (exit_slowdown, crit_exit_slowdown, keep_share).
//
// The rules, in order (docs/whatif.md, "Verdicts"): below warn_slowdown, balanced; one op group
// (GC, or a kind of communication) explains S; a stage explains S and holds more compute than
// the stages' mean on every replica: stage imbalance (a stage that explains S across replicas
// is not a moving replica, whatever the slowest replica of each step); the slowest replica
// moves from step to step: sequence imbalance; one replica and one stage explain it: slow
// worker; else unattributed.
WhatIfVerdict JudgeWhatIf(const WindowResult& result, const Layout& layout,
                          const std::vector<std::vector<uint32_t>>& worker_ranks,
                          const OpStats& stats, const VerdictOptions& options,
                          const WhatIfVerdict* held = nullptr);

// Whether two verdicts name the same finding: kind, culprit and op group (not the numbers).
bool SameFinding(const WhatIfVerdict& a, const WhatIfVerdict& b);

// VerdictHold: the verdict a live job shows, steadied. The first verdict is taken as judged;
// after it, a judged verdict naming another finding replaces the held one only after it was
// judged for hold_steps consecutive analysed steps (each evaluation counts the steps analysed
// since the previous one); meanwhile the held verdict stays, with the window's current S and
// loss. A judgement of the held finding itself updates it and drops the candidate.
//
// Deterministic: a function of the (verdict, analysed steps) sequence. Not thread-safe: owned
// by the job's StepAssembler.
class VerdictHold {
 public:
  explicit VerdictHold(uint32_t hold_steps) : hold_steps_(hold_steps) {}

  // The verdict judged at an evaluation (with held() as JudgeWhatIf's `held`) and the job's
  // analysed steps so far. Returns the verdict to show.
  const WhatIfVerdict& Update(WhatIfVerdict judged, uint64_t analysed_steps);

  // The held verdict; null before the first Update (or after one that judged kNone).
  const WhatIfVerdict* held() const { return has_held_ ? &held_ : nullptr; }
  // The finding waiting to replace the held one (kNone: none) and the analysed steps when it was
  // first judged.
  const WhatIfVerdict& candidate() const { return candidate_; }
  uint64_t candidate_since() const { return candidate_since_; }

  // Restores the state Update built (for a restored job): the held verdict (null: none), the
  // candidate and since when.
  void Restore(const WhatIfVerdict* held, const WhatIfVerdict& candidate, uint64_t candidate_since);

 private:
  uint32_t hold_steps_;
  bool has_held_ = false;
  WhatIfVerdict held_;
  WhatIfVerdict candidate_;  // verdict kNone: no candidate
  uint64_t candidate_since_ = 0;
};

}  // namespace rankwatch::whatif
