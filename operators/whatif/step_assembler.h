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
// flat data-parallel jobs keep the step-time diagnosis alone.
//
// Checkpointed with the job (docs/whatif.md, "Restarts"): each analysed step's ops as the ranks
// sent them (Aligned hands them out as a state::v1::WhatIfStepOps, stored one key per step while
// the window holds the step), and the rest as a state::v1::WhatIfState (ExportState): layout,
// workers' ranks, counters, the ops of steps still waiting for alignment, the finding's held
// onset. Restore replays the stored steps into a new analyzer: the same window, hence the same
// S and verdict (decompositions within the analyzer's 1 % recompute tolerance).
//
// Not thread-safe: owned by the job's JobPipeline.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "operators/step_time/onset.h"
#include "operators/whatif/verdict.h"
#include "operators/whatif/whatif.h"
#include "rankwatch/state/v1/job_state.pb.h"
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
  // A finding's onset (IsFinding): the step where the per-step slowdown stepped up, held while
  // the same finding holds, also after it left the window (step_time/onset.h); onset_known
  // false: since that step or earlier. 0 without a finding.
  uint64_t since_step = 0;
  bool onset_known = false;
};

// Whether the verdict is a finding of the what-if (a pipeline job's straggler): neither none,
// balanced, nor unattributed at info.
bool IsFinding(const WhatIfVerdict& v);

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
  // Returns whether it was analysed; then `stored` (optional) gets its ops for the checkpoint.
  bool Aligned(uint64_t step, state::v1::WhatIfStepOps* stored = nullptr);

  // Recomputes the window result and the verdict after one or more Aligned calls (cheap when
  // nothing was analysed since the previous call).
  void Evaluate();

  // Null until the job has a pipeline layout; afterwards the latest evaluation.
  std::shared_ptr<const WhatIfSnapshot> snapshot() const { return snapshot_; }
  bool active() const { return analyzer_ != nullptr; }

  // ---- Checkpoints ----
  // Everything but the window's steps into `out`; false (nothing written) while inactive.
  // New state of the what-if (the verdict's hold) goes into WhatIfState too.
  bool ExportState(state::v1::WhatIfState* out) const;
  // The oldest step of the window, whose stored ops a restore needs (0: none).
  uint64_t window_first_step() const;
  // Rebuilds what ExportState wrote, replays `steps` (stored analysed steps, ascending; those
  // of another world size than `world_size` are skipped) into the analyzer without counting
  // them again, and evaluates. A damaged state is DataLoss.
  absl::Status Restore(const state::v1::WhatIfState& state,
                       const std::vector<state::v1::WhatIfStepOps>& steps, uint32_t world_size);

 private:
  // An op as a rank sent it (v1::OpRecord's integers).
  struct RawOp {
    uint8_t kind = 0;
    uint16_t microbatch = 0;
    uint16_t chunk = 0;
    uint64_t start_offset_us = 0;
    uint64_t duration_us = 0;
  };
  struct RawGc {
    int64_t shift_ns = 0;  // its rank's origin - the step's origin
    RawOp op;
  };
  struct Pending {
    std::vector<std::vector<RawOp>> workers;  // without GC pauses
    std::vector<int64_t> shift_ns;    // per worker: its tensor rank's origin - the step's origin
    std::vector<uint32_t> worker_tp;  // the tensor rank whose ops a worker holds (UINT32_MAX: none)
    // GC pauses of every tensor rank of a worker (a pause on one stalls its peers in their next
    // tensor-parallel collective): merged into the worker's ops when the step is analysed.
    std::vector<std::vector<RawGc>> gc;
    int64_t origin_unix_ns = 0;
    uint32_t filled = 0;
  };
  bool Accepts(const v1::ParallelLayout& l) const;
  void Activate(const Layout& layout);
  Pending NewPending(int64_t origin_unix_ns) const;
  // The step as the analyzer takes it (times in µs on the step's base, GC merged).
  StepOps Assemble(uint64_t step, const Pending& p) const;
  // The step's ops as stored, and back (DataLoss when they do not fit the layout).
  void Encode(uint64_t step, const Pending& p, bool pending, state::v1::WhatIfStepOps* out) const;
  absl::Status Decode(const state::v1::WhatIfStepOps& in, bool pending, Pending* p) const;
  // Adds an assembled step to the analyzer and the op statistics.
  absl::Status Analyse(const StepOps& ops);

  AssemblerOptions options_;
  Layout layout_;
  std::unique_ptr<Analyzer> analyzer_;
  std::unique_ptr<OpStats> stats_;
  std::vector<std::vector<uint32_t>> worker_ranks_;
  std::map<uint64_t, Pending> pending_;
  std::vector<uint64_t> window_steps_;  // the analysed steps the analyzer's window holds
  uint64_t analysed_ = 0;
  uint64_t skipped_ = 0;
  uint64_t analysed_at_evaluation_ = 0;
  std::string last_error_;
  step_time::OnsetHold onset_;
  VerdictHold hold_;  // the verdict shown, steadied (hysteresis, hold_steps)
  std::shared_ptr<const WhatIfSnapshot> snapshot_;
};

}  // namespace rankwatch::whatif
