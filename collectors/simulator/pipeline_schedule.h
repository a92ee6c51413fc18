// PipelineSchedule: one training step of a data x pipeline x tensor parallel job, simulated op
// by op — the model behind `rankwatch simulate --parallel` (FleetModel's 3D path).
//
// Each worker (one data-parallel replica d of one pipeline stage s; index s * dp + d, as in
// operators/whatif/whatif.h) runs, by default, Megatron-LM's non-interleaved 1F1B program: the
// params all-gather of its stage's data-parallel group, P - s - 1 warm-up forwards, the steady
// one-forward-one-backward phase with its combined send/receive pairs, the cool-down
// backwards, then the embedding all-reduce between the first and the last stage, the grads
// reduce-scatter of the stage's data-parallel group, gradient clipping (a sync of every
// worker) and the optimizer. Ops of a worker run one after another. A communication op starts
// when its worker reaches it and ends, on every member of its group at once, a transfer time
// after the last member started (a rendezvous: a send waits for its receive; the waiting is
// in the op's duration, as a host-side timer sees it). Ops posted together (Megatron's
// send_forward_recv_backward, send_backward_recv_forward) start together; the worker goes on
// when both ended. Tensor-parallel ranks of a worker are one worker here (lockstep).
//
// Or one of torch.distributed.pipelining's schedules with several model chunks per stage
// and/or the backward split into input and weight gradients (schedule_orders.h: interleaved
// 1F1B, ZB1P / ZB-H1, ZBV, DualPipeV), lowered as torch's runtime runs them: a compute whose
// input comes from another stage waits for a receive posted just before it (torch's
// defer_pp_recv placement); a compute whose output goes to another stage posts a send that
// does not hold its worker up (torch waits for sends at the step's end); a transfer between
// two chunks of one stage (the turn of a V) is no op at all.
//
// Pure functions. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "collectors/simulator/schedule_orders.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// A job's layout: `dp` replicas x `pp` stages x `tp` tensor ranks, `microbatches` per step.
// Ranks in Megatron's order: tensor rank fastest, then data rank, then stage:
// rank = tp_rank + tp * (dp_rank + dp * stage) = tp_rank + tp * worker.
struct PipelineSpec {
  uint32_t dp = 1;
  uint32_t pp = 1;
  uint32_t tp = 1;
  uint32_t microbatches = 8;                                    // default: 8
  PipelineScheduleKind schedule = PipelineScheduleKind::k1F1B;  // default: Megatron's 1F1B
  uint32_t vpp = 1;  // model chunks per stage (default 1; 2 for interleaved, zbv, dualpipev)
  uint32_t workers() const { return dp * pp; }
  // Global model chunk of `chunk` on `stage`: a loop (chunk * pp + stage) or, for the V
  // schedules, down and back (stage, then 2 * pp - 1 - stage).
  uint32_t GlobalChunk(uint32_t stage, uint32_t chunk) const {
    return IsVShaped(schedule) ? (chunk == 0 ? stage : 2 * pp - 1 - stage) : chunk * pp + stage;
  }
  uint32_t StageOfChunk(uint32_t global) const {
    return IsVShaped(schedule) ? (global < pp ? global : 2 * pp - 1 - global) : global % pp;
  }
  uint32_t LocalChunk(uint32_t global) const {
    return IsVShaped(schedule) ? (global < pp ? 0 : 1) : global / pp;
  }
  uint32_t world_size() const { return dp * pp * tp; }
  uint32_t WorkerOf(uint32_t rank) const { return rank / tp; }
  uint32_t StageOf(uint32_t rank) const { return WorkerOf(rank) / dp; }
  uint32_t DataRankOf(uint32_t rank) const { return WorkerOf(rank) % dp; }
  uint32_t TensorRankOf(uint32_t rank) const { return rank % tp; }
};

// Parses `dp=D,pp=P,tp=T[,mb=M][,schedule=S][,vpp=V]` (any order; an absent size is 1, an
// absent mb 8, schedule 1f1b). Sizes are >= 1, the world at most 2^20 ranks, M x V at most 1024
// (a step's ops stay within a batch's 4 MiB). S: 1f1b (V = 1), interleaved (V >= 2, default
// 2), zb (V >= 1, default 1: ZB-H1; V >= 2: ZB1P), zbv and dualpipev (V = 2, P >= 2;
// dualpipev M >= 2P); interleaved and zb need M a multiple of max(1, M / P), as torch does.
// InvalidArgument with a message for the command line.
absl::StatusOr<PipelineSpec> ParsePipelineSpec(std::string_view text);

// One op of a worker's program.
struct ProgramOp {
  v1::OpType type = v1::OP_UNSPECIFIED;
  uint32_t microbatch = 0;
  uint32_t chunk = 0;        // the stage's model chunk
  bool input_only = false;   // a backward-compute that is only the input-gradient part
  bool nonblocking = false;  // a send the worker posts and does not wait for
};

// The program of stage `stage` (every replica runs the same one): a list of slots, each one op
// or two ops posted together. The params all-gather and grads reduce-scatter appear only with
// dp > 1, the embedding all-reduce only with pp > 1 and on the first and the last stage (not
// in the V schedules, whose first stage holds both ends of the model).
std::vector<std::vector<ProgramOp>> StageProgram(const PipelineSpec& spec, uint32_t stage);

// What the ops cost. `compute`: the duration of a forward, backward (full or input-gradient),
// weight-gradient or optimizer op of `worker` (us). `transfer`: the transfer time (us) of a
// communication group, given by one of its ops: `worker` the group's member with the lowest
// index, `microbatch` and `chunk` its microbatch and the lower model chunk's chunk (p2p).
// Both are called once per op or group.
struct StepCosts {
  std::function<double(uint32_t worker, const ProgramOp& op)> compute;
  std::function<double(uint32_t worker, const ProgramOp& op)> transfer;
};

struct TimedOp {
  v1::OpType type = v1::OP_UNSPECIFIED;
  uint32_t microbatch = 0;
  uint32_t chunk = 0;
  bool input_only = false;
  double start_us = 0;  // from the step's start
  double duration_us = 0;
};

struct SimulatedStep {
  std::vector<std::vector<TimedOp>> workers;  // each worker's ops in start order
  double end_us = 0;                          // the last op's end: the step time
};

// Simulates one step: every worker starts at 0. Aborts on a deadlock (a program that cannot
// run to its end: a bug in StageProgram).
SimulatedStep SimulatePipelineStep(const PipelineSpec& spec, const StepCosts& costs);

// "forward-compute" for v1::OP_FORWARD_COMPUTE: the wire's kebab-case names.
std::string_view OpTypeName(v1::OpType type);

}  // namespace rankwatch
