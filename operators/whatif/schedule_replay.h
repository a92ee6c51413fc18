// Replays a StepModel's schedule with given op durations, every data rank at once (the model
// is shared by a stage's data ranks, so each node's times are a vector over them): a node
// starts when its dependencies ended (the step starts at 0, no launch delays); a plain node
// ends after its duration; a communication group's members end at the latest start among the
// members (and, for a synced group, among every data rank) plus each member's transfer time.
//
// Internal to the what-if analyzer. Not thread-safe: a ScheduleReplay owns its scratch buffers.
#pragma once

#include <vector>

#include "operators/whatif/step_model.h"

namespace rankwatch::whatif::internal {

class ScheduleReplay {
 public:
  // `dur` holds model.nodes * dp values, node-major: node v's duration (or transfer time, for a
  // group member) on data rank d at [v * dp + d]. Returns the step time: the latest end among
  // the model's end nodes over every data rank.
  double Run(const StepModel& model, const double* dur);

  // The start and end times of the last Run, same layout as `dur`.
  const std::vector<double>& starts() const { return start_; }
  const std::vector<double>& ends() const { return end_; }

 private:
  std::vector<double> start_;
  std::vector<double> end_;
  std::vector<double> tmp_;
};

}  // namespace rankwatch::whatif::internal
