// What-if analysis of a pipeline x tensor x data parallel job (docs/whatif.md), after the
// OSDI'25 study "Understanding Stragglers in Large Model Training Using What-if Analysis":
// a dependency model of one training step (the pipeline schedule with its send/receive pairs,
// data-parallel collectives, the embedding all-reduce of the first and last stage, gradient
// clipping as a sync of every worker, the optimizer) is simulated with the measured op
// durations ("actual") and with every op replaced by its typical duration among its peers
// ("ideal"). The slowdown S = actual / ideal mean step time. It is decomposed by data-parallel
// rank, by stage, by op type and by worker: the ideal step re-simulated keeping one group's
// measured durations. M_W (individual workers) and M_S (stage imbalance) say how much of the
// slowdown the worst workers or the worst stage explain.
//
// A worker is one (data rank, stage) pair; its tensor ranks move in lockstep. Worker index =
// stage * dp + data rank.
//
// Pure and deterministic. Not thread-safe: one analyzer per job, owned by its JobPipeline.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace rankwatch::whatif {

// The op types; numbers are the wire's v1::OpType values.
enum class OpKind : uint8_t {
  kUnspecified = 0,
  kForwardCompute = 1,
  kBackwardCompute = 2,
  kForwardSend = 3,
  kForwardRecv = 4,
  kBackwardSend = 5,
  kBackwardRecv = 6,
  kTensorParallel = 7,
  kGradsReduceScatter = 8,
  kParamsAllGather = 9,
  kGradsAllReduce = 10,
  kLayernormGradsAllReduce = 11,
  kEmbeddingGradsAllReduce = 12,
  kOptimizerClipMainGrad = 13,
  kOptimizer = 14,
  kGc = 15,
  kDataLoading = 16,
};
inline constexpr int kOpKindCount = 17;

// "forward-compute", "backward-send", ... (the study's names; kGradsAllReduce is
// "grads-all-reduce", the study's "separate-grads-all-reduce" reads as it too).
std::string_view OpKindName(OpKind kind);
std::optional<OpKind> OpKindFromName(std::string_view name);

// The decomposition by op type groups a pipeline's sends and receives by direction, as the
// study does: "forward-pp-comm", "backward-pp-comm"; every other kind is its own group.
std::string_view OpGroupName(OpKind kind);

struct Layout {
  uint32_t dp = 1;   // data-parallel replicas
  uint32_t pp = 1;   // pipeline stages
  uint32_t tp = 1;   // tensor-parallel ranks per worker (lockstep; informational)
  uint32_t vpp = 1;  // model chunks per stage
  uint32_t workers() const { return dp * pp; }
  bool operator==(const Layout&) const = default;
};

struct Op {
  OpKind kind = OpKind::kUnspecified;
  uint16_t microbatch = 0;
  uint16_t chunk = 0;     // model chunk within the stage
  double start_us = 0;    // on a time base common to every worker of the step
  double duration_us = 0;
};

// One aligned step: the ops of every worker, each worker's in start order.
struct StepOps {
  uint64_t step = 0;
  std::vector<std::vector<Op>> workers;  // size layout.workers(); index stage * dp + data rank
};

struct Options {
  // Steps kept (the window the typical durations and the window results come from).
  uint32_t window_steps = 64;
  // M_W: the workers with the highest scores, this fraction of all (at least one).
  double top_worker_fraction = 0.03;
  // Decompose (by DP rank, stage, op type, worker) only when the window's S is at least this;
  // below it the decompositions are empty. The study's default.
  double decompose_min_slowdown = 1.03;
};

// Slowdowns, each actual-or-partial mean step time over ideal mean step time (1 = no loss).
struct Decomposition {
  std::vector<double> by_dp_rank;                 // size dp
  std::vector<double> by_stage;                   // size pp
  std::vector<std::pair<std::string, double>> by_op_group;  // descending
  // Workers re-simulated one by one: the highest-scoring ones (score = min(by_dp_rank[d],
  // by_stage[s]), as the study ranks them), descending; (worker index, slowdown).
  std::vector<std::pair<uint32_t, double>> by_worker;
};

struct StepResult {
  uint64_t step = 0;
  double measured_us = 0;  // last op end - first op start
  double actual_us = 0;    // simulated with measured durations, no launch delays
  double ideal_us = 0;     // simulated with typical durations
  double slowdown = 1;     // actual / ideal
  Decomposition decomposition;
};

struct WindowResult {
  uint32_t steps = 0;
  uint64_t first_step = 0;
  uint64_t last_step = 0;
  double measured_us = 0;  // means over the window
  double actual_us = 0;
  double ideal_us = 0;
  double slowdown = 1;     // S
  Decomposition decomposition;
  // How much of the slowdown (S - 1) the top workers / the worst stage explain: the mean
  // step time with their ops at typical durations, (actual - that) / (actual - ideal).
  double m_w = 0;
  std::vector<uint32_t> m_w_workers;
  double m_s = 0;
  uint32_t m_s_stage = 0;  // the stage with the highest by_stage slowdown
  std::vector<StepResult> per_step;  // oldest first
};

class Analyzer {
 public:
  Analyzer(Layout layout, Options options);
  ~Analyzer();

  // Adds an aligned step. Builds the dependency model from the first step (and again when a
  // step's shape — each stage's op sequence — changes). A step whose ops do not fit a model
  // (a missing worker, an unpaired send) is InvalidArgument with one line saying why; the
  // analyzer is unchanged then.
  absl::Status AddStep(StepOps step);

  // The window's result: typical durations from every step in the window, each step's actual
  // and ideal simulated, decompositions re-simulated. Cached per step and recomputed only for
  // steps whose typical durations moved by more than 1% since.
  WindowResult Window();

  const Layout& layout() const { return layout_; }
  uint32_t steps() const;

 private:
  struct Impl;
  Layout layout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rankwatch::whatif
