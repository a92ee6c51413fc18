// StepAssembler: gathers the op records of a pipeline-parallel job's ranks (StepRecord.ops,
// with each rank's ParallelLayout) into one StepOps per step for the what-if Analyzer, and
// owns the analyzer, its op statistics and the latest verdict.
//
// A worker (data rank, stage) is represented by its lowest tensor rank that sent ops (tensor
// ranks move in lockstep); its GC pauses are those of any of its tensor ranks (overlapping
// pauses of two ranks count once). Op times become microseconds on a common time base: the first
// origin (ops_origin_unix_ns) any rank sent for the step.
//
// The what-if runs for a job whose ranks declare a layout with more than one pipeline stage;
// flat data-parallel jobs keep the step-time diagnosis alone. Its state is not checkpointed:
// after a restart it starts again from new steps (docs/whatif.md).
//
// Not thread-safe: owned by the job's JobPipeline.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "operators/whatif/verdict.h"
#include "operators/whatif/whatif.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch::whatif {

// What a snapshot shows of the what-if: immutable once made.
struct WhatIfSnapshot {
  Layout layout;
  WindowResult result;
  WhatIfVerdict verdict;
  std::vector<std::vector<uint32_t>> worker_ranks;  // index stage * dp + data rank
  uint64_t analysed_steps = 0;                      // since the pipeline started
  uint64_t skipped_steps = 0;                       // aligned without every worker's ops
  std::string last_error;                           // why the last skipped step was skipped
};

struct AssemblerOptions {
  Options analyzer;
  VerdictOptions verdict;
  // Steps whose ops are kept while they wait for alignment; older ones are dropped.
  uint32_t max_pending_steps = 256;
};

class StepAssembler {
 public:
  explicit StepAssembler(AssemblerOptions options);
  ~StepAssembler();

  // One rank's record. `layout` is the rank's identity's layout. Cheap when the record has no
  // ops. Ranks whose layout disagrees with the job's (other sizes) are ignored and counted.
  void Add(uint32_t rank, const v1::ParallelLayout& layout, const v1::StepRecord& record);

  // The step was aligned: analyse it if every worker sent ops, and drop older pending steps.
  void Aligned(uint64_t step);

  // Recomputes the window result and the verdict after one or more Aligned calls (cheap when
  // nothing was analysed since the previous call).
  void Evaluate();

  // Null until the job has a pipeline layout; afterwards the latest evaluation.
  std::shared_ptr<const WhatIfSnapshot> snapshot() const { return snapshot_; }
  bool active() const { return analyzer_ != nullptr; }

 private:
  struct Pending {
    std::vector<std::vector<Op>> workers;
    std::vector<uint32_t> worker_tp;  // the tensor rank whose ops a worker holds (UINT32_MAX: none)
    // GC pauses of every tensor rank of a worker (a pause on one stalls its peers in their next
    // tensor-parallel collective): merged into the worker's ops when the step is analysed.
    std::vector<std::vector<Op>> gc;
    int64_t origin_unix_ns = 0;
    uint32_t filled = 0;
  };
  bool Accepts(const v1::ParallelLayout& l) const;

  AssemblerOptions options_;
  Layout layout_;
  std::unique_ptr<Analyzer> analyzer_;
  std::unique_ptr<OpStats> stats_;
  VerdictHold hold_;  // the verdict shown, steadied (hysteresis, hold_steps)
  std::vector<std::vector<uint32_t>> worker_ranks_;
  std::map<uint64_t, Pending> pending_;
  uint64_t analysed_ = 0;
  uint64_t skipped_ = 0;
  uint64_t analysed_at_evaluation_ = 0;
  std::string last_error_;
  std::shared_ptr<const WhatIfSnapshot> snapshot_;
};

}  // namespace rankwatch::whatif
