// FleetModel: the synthetic training job behind `rankwatch simulate` — what every rank
// reports for each step, including injected faults and data-parallel synchronisation.
//
// Deterministic: the record of (rank, step) depends only on the options (seed included),
// never on call order. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectors/simulator/fault_spec.h"
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
};

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

  const FleetOptions options_;
  std::vector<int64_t> rank_elapsed_ns_;
  int64_t job_elapsed_ns_ = 0;
  int64_t job_start_unix_ns_ = 0;
  std::vector<Local> scratch_;
};

}  // namespace rankwatch
