// PipelineSchedule: one training step of a data x pipeline x tensor parallel job, simulated op
// by op — the model behind `rankwatch simulate --parallel` (FleetModel's 3D path).
//
// Each worker (one data-parallel replica d of one pipeline stage s; index s * dp + d, as in
// operators/whatif/whatif.h) runs Megatron-LM's non-interleaved 1F1B program: the params
// all-gather of its stage's data-parallel group, P - s - 1 warm-up forwards, the steady
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
// Pure functions. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// A job's layout: `dp` replicas x `pp` stages x `tp` tensor ranks, `microbatches` per step.
// Ranks in Megatron's order: tensor rank fastest, then data rank, then stage:
// rank = tp_rank + tp * (dp_rank + dp * stage) = tp_rank + tp * worker.
struct PipelineSpec {
  uint32_t dp = 1;
  uint32_t pp = 1;
  uint32_t tp = 1;
  uint32_t microbatches = 8;  // default: 8
  uint32_t workers() const { return dp * pp; }
  uint32_t world_size() const { return dp * pp * tp; }
  uint32_t WorkerOf(uint32_t rank) const { return rank / tp; }
  uint32_t StageOf(uint32_t rank) const { return WorkerOf(rank) / dp; }
  uint32_t DataRankOf(uint32_t rank) const { return WorkerOf(rank) % dp; }
  uint32_t TensorRankOf(uint32_t rank) const { return rank % tp; }
};

// Parses `dp=D,pp=P,tp=T[,mb=M]` (any order; an absent size is 1, an absent mb 8). Sizes are
// >= 1, the world at most 2^20 ranks, M in 1..1024 (a step's ops stay within a batch's 4 MiB).
// InvalidArgument with a message for the command line.
absl::StatusOr<PipelineSpec> ParsePipelineSpec(std::string_view text);

// One op of a worker's program.
struct ProgramOp {
  v1::OpType type = v1::OP_UNSPECIFIED;
  uint32_t microbatch = 0;
};

// The program of stage `stage` (every replica runs the same one): a list of slots, each one op
// or two ops posted together. The params all-gather and grads reduce-scatter appear only with
// dp > 1, the embedding all-reduce only with pp > 1 and on the first and the last stage.
std::vector<std::vector<ProgramOp>> StageProgram(const PipelineSpec& spec, uint32_t stage);

// What the ops cost. `compute`: the duration of a forward/backward compute or optimizer op of
// `worker` (us). `transfer`: the transfer time (us) of a communication group, given by one of
// its ops: `worker` the group's member with the lowest index, `microbatch` its microbatch
// (p2p). Both are called once per op or group.
struct StepCosts {
  std::function<double(uint32_t worker, const ProgramOp& op)> compute;
  std::function<double(uint32_t worker, const ProgramOp& op)> transfer;
};

struct TimedOp {
  v1::OpType type = v1::OP_UNSPECIFIED;
  uint32_t microbatch = 0;
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
