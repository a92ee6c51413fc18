// Binds one step's measured ops to the nodes of its StepModel: each node's measured duration
// (compute-like nodes, GC time carved out of the compute it overlaps) or transfer time
// (communication group members: end minus the latest start among the group), per data rank,
// and the per-kind sums the window's typical durations come from.
//
// Internal to the what-if analyzer. A BoundStep is a plain value; BindScratch is scratch owned
// by its caller.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "operators/whatif/step_model.h"

namespace rankwatch::whatif::internal {

// A transfer time this far below zero (a member that ended long before a peer started, i.e.
// clocks out of step) counts as 0; smaller negatives are kept, as the study does (its 10 ms).
inline constexpr double kNegativeTransferFloorUs = -10'000;

struct BoundStep {
  uint64_t step = 0;
  std::shared_ptr<const StepModel> model;
  std::vector<double> measured;  // model->nodes * dp, node-major (ScheduleReplay::Run's `dur`)
  double measured_us = 0;        // last op end - first op start, over every worker
  // Compute-like kinds, by typical slot (a kind, or kFullBackwardTypical): the sum and count
  // of their nodes' measured durations; for kGc the sum of every GC op and the count of workers
  // (GC time per worker and step).
  std::array<double, kTypicalCount> mean_sum{};
  std::array<uint64_t, kTypicalCount> mean_count{};
  // Communication kinds: every measured transfer time (or duration) of the kind, sorted.
  std::array<std::vector<double>, kOpKindCount> sorted{};
  std::array<uint32_t, kOpKindCount> ops{};  // ops of each kind in the step
  std::vector<double> stage_compute_us;      // per stage: forward + backward (+ weight), summed
};

struct BindScratch {
  std::vector<double> start;
  std::vector<double> end;
  std::vector<double> group_start;
};

// InvalidArgument (one line) when a worker's op counts differ from its stage's model.
absl::Status BindStep(std::shared_ptr<const StepModel> model, const StepOps& step,
                      const std::vector<WorkerIndex>& index, BindScratch* scratch, BoundStep* out);

}  // namespace rankwatch::whatif::internal
