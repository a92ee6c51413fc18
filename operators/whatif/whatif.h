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
// The model (docs/whatif.md has it in full): per stage one chain of compute ops (forward,
// backward and weight-gradient compute, data loading, GC pauses) in start order; pipeline
// sends and receives paired across neighbouring stages by order, each direction a chain, or —
// torch's interleaved, zero-bubble and V schedules — by microbatch and model chunk; data-parallel
// collectives synchronised over the stage's data ranks; after the last compute the chain
// layernorm -> embedding -> reduce-scatters (or the separate grads all-reduce) -> clip ->
// optimizer. A collective ends at the latest start among its members plus its own transfer
// time (measured: its end minus that latest start). Ideal durations: the window's mean for
// compute-like kinds, the window's median transfer time for communication kinds.
//
// Pure and deterministic. Not thread-safe: one analyzer per job, owned by its JobPipeline.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
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
  kBackwardWeightCompute = 17,  // zero-bubble schedules' weight-gradient part ("W")
};
inline constexpr int kOpKindCount = 18;

// "forward-compute", "backward-send", ... (the study's names; kGradsAllReduce is
// "grads-all-reduce", the study's "separate-grads-all-reduce" reads as it too).
std::string_view OpKindName(OpKind kind);
std::optional<OpKind> OpKindFromName(std::string_view name);

// Communication kinds get the window's median transfer time as their ideal duration, the others
// (compute, optimizer, GC, data loading) the window's mean duration. kTensorParallel and
// kUnspecified are not modelled (informational: ignored).
bool IsCommunication(OpKind kind);
bool IsModelled(OpKind kind);

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
  uint16_t chunk = 0;   // model chunk within the stage (< layout.vpp)
  double start_us = 0;  // on a time base common to every worker of the step
  double duration_us = 0;
};

// One aligned step: the ops of every worker, each worker's in start order (the analyzer sorts
// them again by start; equal starts keep their order). A kind's n-th op on a worker (by
// start) is the same op on every data rank of the stage: each data rank of a stage must have
// as many ops of each kind as the others. GC ops may sit anywhere and differ between workers.
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
  // below it the decompositions are empty and m_w, m_s are 0. The study's default.
  double decompose_min_slowdown = 1.03;
  // Window() re-simulates a step's decompositions only when a typical duration moved by more
  // than this fraction since they were computed.
  double recompute_tolerance = 0.01;
};

// Slowdowns, each actual-or-partial mean step time over ideal mean step time (1 = no loss).
struct Decomposition {
  std::vector<double> by_dp_rank;                           // size dp
  std::vector<double> by_stage;                             // size pp
  std::vector<std::pair<std::string, double>> by_op_group;  // descending
  // Workers re-simulated one by one: the highest-scoring ones (score = min(by_dp_rank[d],
  // by_stage[s]), as the study ranks them; as many as M_W takes), in score order (worker
  // index, slowdown).
  std::vector<std::pair<uint32_t, double>> by_worker;
  bool empty() const { return by_dp_rank.empty(); }
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
  double slowdown = 1;  // S
  Decomposition decomposition;
  // How much of the slowdown (S - 1) the top workers / a stage explain: with t_rem the mean
  // step time simulated with their ops at typical durations (all others measured),
  // (actual - t_rem) / (actual - ideal). 1 = all of it, 0 = none; 0 when not decomposed.
  double m_w = 0;
  std::vector<uint32_t> m_w_workers;  // the top ceil(top_worker_fraction * workers), by score
  double m_s = 0;
  uint32_t m_s_stage = 0;  // the stage with the highest by_stage slowdown (lowest on ties)
  double m_s_last = 0;     // the study's M_S: the same for the last stage (pp - 1)
  // Typical (ideal) duration of each kind over the window, µs: mean or median transfer time
  // (IsCommunication); for kGc the mean GC time per worker and step; for kBackwardCompute in a
  // zero-bubble step the input-gradient part (full backwards, both parts in one op, are
  // ideally this plus kBackwardWeightCompute's). 0 for absent kinds.
  std::array<double, kOpKindCount> typical_us{};
  // Mean forward + backward (and weight-gradient) compute time per worker and step, by stage
  // (size pp), µs.
  std::vector<double> stage_compute_us;
  std::vector<StepResult> per_step;  // oldest first
};

// The re-simulations of one window step that Window() keeps while the typical durations stay
// within recompute_tolerance of those they were computed with: what a checkpoint stores so that
// a restored analyzer (the same steps added again, then ImportCache) gives exactly the results
// of the one that exported it. Plain values; NaN marks what was not simulated.
struct StepCache {
  bool cached = false;
  std::vector<double> typical;  // the typical durations they were computed with
  std::vector<double> dp_t, stage_t, group_t;
  std::vector<std::pair<uint32_t, double>> worker_t;     // worker -> ideal but that worker
  std::vector<std::pair<uint32_t, double>> stage_rem_t;  // stage -> actual but that stage ideal
  std::vector<uint32_t> rem_workers;
  double rem_workers_t = 0;
};

class Analyzer {
 public:
  Analyzer(Layout layout, Options options);
  ~Analyzer();

  // Adds an aligned step and simulates it with its measured durations. Builds the dependency
  // model from the step's data rank 0 (and again when a step's shape — a stage's op counts,
  // its compute sequence, where GC pauses fall — changes; recent models are cached). A step
  // whose ops do not fit a model (a missing worker, an unpaired send, data ranks of a stage
  // with different op counts, a negative duration) is InvalidArgument with one line saying
  // why; the analyzer is unchanged then. The oldest step leaves when the window is full.
  absl::Status AddStep(StepOps step);

  // The window's result: typical durations from every step in the window, each step's actual
  // and ideal simulated, decompositions re-simulated. Decompositions are cached per step and
  // recomputed only for steps whose typical durations moved by more than
  // recompute_tolerance since. An empty window gives steps == 0.
  WindowResult Window();

  const Layout& layout() const { return layout_; }
  uint32_t steps() const;

  // The cache of each window step, oldest first (for a checkpoint).
  std::vector<StepCache> ExportCache() const;
  // Gives the window's steps the caches ExportCache gave for the same steps. InvalidArgument
  // (nothing changed) when they do not fit: another count, or sizes of another layout.
  absl::Status ImportCache(const std::vector<StepCache>& cache);

 private:
  struct Impl;
  Layout layout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rankwatch::whatif
