// StepWindow: the last K aligned steps of one job, with per-rank running sums of every phase.
//
// Adding a step is O(ranks); sums are maintained incrementally (the evicted step is
// subtracted), so cross-rank statistics never rescan the window.
//
// Not thread-safe: owned by the job's worker thread.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "operators/step_aligner.h"

namespace rankwatch {

struct StepWindowOptions {
  // Aligned steps the window covers (spec K). Default: 100.
  size_t steps = 100;
};

class StepWindow {
 public:
  // Window sums of one rank: per phase, the sum over the steps it reported and their count;
  // the same for its GC pauses (time and collections over the steps that reported GC).
  struct RankTotals {
    std::array<int64_t, kPhaseCount> sum_ns{};
    std::array<uint32_t, kPhaseCount> count{};
    int64_t gc_sum_ns = 0;
    uint64_t gc_collections = 0;
    uint32_t gc_steps = 0;
  };

  StepWindow(uint32_t world_size, StepWindowOptions options);

  // Appends an aligned step (ranks outside the world size are ignored); evicts the oldest
  // step once the window holds more than `options.steps`.
  void Add(const AlignedStep& step);

  size_t size() const { return steps_.size(); }
  size_t capacity() const { return options_.steps; }  // K
  bool empty() const { return steps_.empty(); }
  uint32_t world_size() const { return world_size_; }
  uint64_t first_step() const { return steps_.front().step; }
  uint64_t last_step() const { return steps_.back().step; }
  // Ranks present in the newest step.
  uint32_t last_ranks_present() const { return steps_.back().ranks_present; }
  const std::vector<RankTotals>& totals() const { return totals_; }

  // Rank-steps of the window by the clock their records were timed with (StepSample's clock
  // bits): on the device, on the host; of the host ones, those whose device times were missing.
  struct ClockSteps {
    uint64_t device = 0;
    uint64_t host = 0;
    uint64_t device_missing = 0;  // of `host`
  };
  const ClockSteps& clock_steps() const { return clock_steps_; }

  // One rank's phases in one step of the window, and its GC pauses (StepSample's fields).
  struct Entry {
    uint32_t rank;
    uint32_t present;  // as StepSample::present, kGcBit and the clock bits included
    std::array<int64_t, kPhaseCount> ns;
    int64_t gc_ns = 0;
    uint32_t gc_count = 0;
    bool Has(Phase p) const { return present & (1u << static_cast<int>(p)); }
    bool HasGc() const { return present & kGcBit; }
    int64_t Get(Phase p) const { return ns[static_cast<int>(p)]; }
  };
  // Values a diagnosis derives from one step alone, kept with the step so that re-evaluating a
  // sliding window derives only its new steps' (step_time::ReferenceOf, one slot per signal;
  // step_time::NewestSteps, the fourth).
  // `key` names what they were derived under (the owner's; a change re-derives them).
  struct Derived {
    bool valid = false;
    std::array<double, 3> key{};
    std::vector<double> values;
  };
  struct Step {
    uint64_t step;
    uint32_t ranks_present;
    std::vector<Entry> entries;  // in the aligned step's sample order: ascending rank
    mutable std::array<Derived, 4> derived{};
  };
  // The steps of the window, oldest first.
  const std::deque<Step>& steps() const { return steps_; }

 private:
  void Apply(const Entry& e, int sign);

  const uint32_t world_size_;
  const StepWindowOptions options_;
  std::deque<Step> steps_;
  std::vector<RankTotals> totals_;
  ClockSteps clock_steps_;
};

}  // namespace rankwatch
