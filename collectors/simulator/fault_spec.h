// FaultSpec: one fault the fleet simulator injects, parsed from the command line as
// `KIND:TARGET[:MAGNITUDE[:FROM_STEP[-UNTIL_STEP]]]`, TARGET a rank number, `node<N>` or
// `all`; the fault holds for FROM_STEP <= step < UNTIL_STEP (no end by default).
// The faults of parallel layouts (and gc) name their parameters instead:
// `KIND:KEY=VALUE[,KEY=VALUE...][:FROM_STEP[-UNTIL_STEP]]`, e.g.
// `slow-worker:dp=0,pp=1,factor=1.3`. Plain data: no state, thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankwatch {

enum class FaultKind {
  kSlowCompute,      // forward+backward take MAGNITUDE longer (0.3 = +30%); default 0.3
  kSlowInput,        // dataloader x(1+MAGNITUDE); default 1.0
  kInputBound,       // dataloader becomes MAGNITUDE x compute; default 1.0
  kWait,             // extra wait of MAGNITUDE x step; default 0.2
  kMemoryLeak,       // +MAGNITUDE MiB per step since FROM_STEP; default 64
  kMemoryImbalance,  // x(1+MAGNITUDE) memory; default 0.3
  kMemoryPressure,   // peak at MAGNITUDE x capacity; default 0.95
  kHang,             // stops reporting (under DDP every rank stops at that step)
  // Host code outside every measured phase (between forward and backward, say) takes
  // MAGNITUDE x the nominal step (0.2 = +20% of the step); default 0.2. The rank's own time:
  // under DDP every other rank waits for it inside backward.
  kSlowHost,
  // --parallel only. `slow-worker:dp=D,pp=S[,factor=F]`: the forward and backward compute of
  // the worker (replica D, stage S; all its tensor ranks) x F; default 1.3.
  kSlowWorker,
  // --parallel only. `stage-imbalance:stage=S[,factor=F]`: stage S's compute x F on every
  // replica (the stage holds too many layers); default 1.25.
  kStageImbalance,
  // --parallel only. `sequence-imbalance[:spread=X]`: each step, each data-parallel replica's
  // compute (every stage of it) x (1 + X v), v uniform in [-1, 1) drawn per replica and step:
  // the work is the same on average, unevenly spread, and the slowest replica moves from step
  // to step; X in [0, 1), default 0.3.
  kSequenceImbalance,
  // `gc:rank=R[,every=N][,ms=X]`: a garbage-collection pause of X ms on rank R on every N-th
  // step from FROM_STEP (defaults 10 steps, 100 ms), recorded in the rank's gc_ns/gc_count.
  // With --parallel it lies inside one forward compute op, which it lengthens on every tensor
  // rank of the worker (they wait for R in lockstep), and is an OP_GC op of rank R; flat, it
  // lengthens R's forward.
  kGc,
};

struct FaultTarget {
  enum class Kind { kRank, kNode, kAll } kind = Kind::kAll;
  uint32_t index = 0;  // rank or node number
};

struct FaultSpec {
  FaultKind kind = FaultKind::kSlowCompute;
  FaultTarget target;  // gc: the rank; the other keyed kinds: kAll
  // The kind's number: MAGNITUDE; slow-worker and stage-imbalance: the factor;
  // sequence-imbalance: the spread; gc: the pause in ms.
  double magnitude = 0;
  uint32_t dp = 0;     // slow-worker: the data-parallel rank
  uint32_t stage = 0;  // slow-worker, stage-imbalance: the pipeline stage
  uint32_t every = 1;  // gc: every N-th step
  uint64_t from_step = 0;
  uint64_t until_step = UINT64_MAX;  // exclusive
};

// Parses a fault; errors are InvalidArgument with a message fit for the command line.
absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text);

// Whether the kind is written with KEY=VALUE parameters (slow-worker, stage-imbalance,
// sequence-imbalance, gc).
bool IsKeyedFault(FaultKind kind);

std::string_view FaultKindName(FaultKind kind);

}  // namespace rankwatch
