// FleetModel: the synthetic training job behind `rankwatch simulate` — what every rank
// reports for each step, including injected faults and data-parallel synchronisation. With
// FleetOptions::parallel, a data x pipeline x tensor parallel job: each step is a simulated
// pipeline schedule (1F1B by default; pipeline_schedule.h) and every record carries the rank's
// op records.
//
// Deterministic: the record of (rank, step) depends only on the options (seed included),
// never on call order. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "collectors/simulator/fault_spec.h"
#include "collectors/simulator/pipeline_schedule.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

struct FleetOptions {
  std::string training_job = "sim";
  uint32_t ranks = 8;
  uint32_t ranks_per_node = 8;  // default: 8
  double step_ms = 100;         // default: 100 ms nominal step
  // kDdp: ranks finish each step together; faster ranks absorb the difference as
  // collective wait inside backward. kNone: ranks run independently. Default: kDdp.
  enum class Sync { kDdp, kNone } sync = Sync::kDdp;
  bool report_collective = false;  // report `collective` time in the records
  double jitter = 0.05;            // default: each phase x(1 +- 5%) uniformly per step
  uint64_t seed = 1;
  std::vector<FaultSpec> faults;
  uint64_t device_capacity_bytes = 80ull << 30;  // 80 GiB
  uint64_t base_peak_bytes = 40ull << 30;        // ~40 GiB peaks

  // A data x pipeline x tensor parallel job (`--parallel`): `ranks` must be its world size
  // and `sync` kDdp; `jitter` is unused, `op_noise` takes its place. Absent (default): flat
  // data parallelism as above, unchanged.
  std::optional<PipelineSpec> parallel;
  double op_noise = 0.02;    // each op's duration x lognormal(0, op_noise); default 2%
  double clock_skew_us = 0;  // each node's clock off by N(0, clock_skew_us); default 0
  // Nominal op durations, µs; absent (default): NominalPipelineCosts' shares of step_ms.
  struct PipelineCosts {
    // One microbatch's compute on one stage (all its model chunks; a chunk takes its share).
    double forward = 0, backward = 0;  // backward: the full backward
    // Zero-bubble schedules' split backward: the input-gradient part (a backward-compute op)
    // and the weight-gradient part (a backward-weight-compute op); their sum is `backward`.
    double backward_input = 0, weight = 0;
    double p2p = 0;  // a send/receive pair's transfer
    double params_all_gather = 0, grads_reduce_scatter = 0, embedding = 0, clip = 0;
    double optimizer = 0;
  };
  std::optional<PipelineCosts> pipeline_costs;
};

// Nominal shares of step_ms with --parallel: the 1F1B compute (M + P - 1)(f + b), backward
// twice forward (its input and weight parts one forward each), takes 80 % of the step (other
// schedules' steps are shorter, their bubbles smaller); a pipeline transfer is 2 % of a
// microbatch's forward; params all-gather 3 %, grads reduce-scatter 5 % (with dp > 1), embedding
// all-reduce 1 % (pp > 1), clipping 0.5 %, optimizer 5 %. A balanced job's step is then about
// step_ms.
struct PipelineShares {
  static constexpr double kCompute = 0.80;
  static constexpr double kP2pOfForward = 0.02;
  static constexpr double kParamsAllGather = 0.03;
  static constexpr double kGradsReduceScatter = 0.05;
  static constexpr double kEmbedding = 0.01;
  static constexpr double kClip = 0.005;
  static constexpr double kOptimizer = 0.05;
};

// The op durations a --parallel job uses: options.pipeline_costs, or PipelineShares of
// step_ms. Requires options.parallel.
FleetOptions::PipelineCosts NominalPipelineCosts(const FleetOptions& options);

// Checks the options against each other: with `parallel`, ranks = its world size, sync kDdp,
// no slow-input/input-bound/wait/slow-host faults, fault coordinates inside the layout;
// without it, no slow-worker/stage-imbalance/sequence-imbalance; rank targets inside the world.
// InvalidArgument with a message for the command line. FleetModel requires it OK.
absl::Status CheckFleetOptions(const FleetOptions& options);

// Nominal shares of the step: dataloader 5%, forward 30%, backward 55%,
// optimizer 8%, wait 2%. Under DDP 5% of the step is allreduce inside backward.
struct PhaseShares {
  static constexpr double kDataloader = 0.05;
  static constexpr double kForward = 0.30;
  static constexpr double kBackward = 0.55;
  static constexpr double kOptimizer = 0.08;
  static constexpr double kWait = 0.02;
  static constexpr double kAllreduce = 0.05;
};

class FleetModel {
 public:
  explicit FleetModel(FleetOptions options);

  // Generates step `step` for every rank. `records` is resized to the rank count; entries of
  // ranks that do not report this step (hang) have `reported[rank] == false`.
  // `end_unix_ns` is filled from `job_start_unix_ns` plus the rank's elapsed step time.
  void Step(uint64_t step, std::vector<v1::StepRecord>* records, std::vector<bool>* reported);

  // Node name of a rank ("node-3"), and the node index.
  std::string NodeName(uint32_t rank) const;
  uint32_t NodeOf(uint32_t rank) const { return rank / options_.ranks_per_node; }

  // The rank's coordinates (requires options().parallel).
  v1::ParallelLayout LayoutOf(uint32_t rank) const;

  // Nanoseconds the whole job took for the steps generated so far (slowest rank).
  int64_t elapsed_ns() const { return job_elapsed_ns_; }
  void set_job_start_unix_ns(int64_t t) { job_start_unix_ns_ = t; }
  const FleetOptions& options() const { return options_; }

 private:
  // What one rank would take on its own, before waiting for other ranks. `outside` is time in
  // no measured phase that the rank itself spends (slow-host): like `wait` it shows only in
  // step_time, but it is the rank's own time, not waiting.
  struct Local {
    double dataloader, forward, backward, optimizer, wait, outside;
    double total() const { return dataloader + forward + backward + optimizer + wait + outside; }
  };
  bool Targets(const FaultSpec& fault, uint32_t rank, uint64_t step) const;
  bool Hangs(uint32_t rank, uint64_t step) const;
  Local LocalPhases(uint32_t rank, uint64_t step) const;
  void FillMemory(uint32_t rank, uint64_t step, v1::StepRecord* record) const;
  double Jitter(uint32_t rank, uint64_t step, uint32_t salt) const;
  // Flat gc faults: the pauses of `rank` at `step`.
  void GcPauses(uint32_t rank, uint64_t step, double* ns, uint32_t* count) const;

  // --parallel (fleet_model_parallel.cc).
  void PipelineStep(uint64_t step, std::vector<v1::StepRecord>* records,
                    std::vector<bool>* reported);
  // Uniform in [0, 1) and standard normal, from the seed and three keys.
  double Uniform(uint64_t a, uint64_t b, uint64_t c) const;
  double Normal(uint64_t a, uint64_t b, uint64_t c) const;

  const FleetOptions options_;
  std::vector<int64_t> rank_elapsed_ns_;
  int64_t job_elapsed_ns_ = 0;
  int64_t job_start_unix_ns_ = 0;
  std::vector<Local> scratch_;
};

}  // namespace rankwatch
