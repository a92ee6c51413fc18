// LostTime: what stragglers and hangs cost a training job, in rank-seconds
// (docs/spec/step-diagnosis.md section 3, "Lost time").
//
// For each aligned step of a synchronised job with N ranks present, let own_r be rank r's own
// time (step time minus the time it spent blocked waiting for other ranks, BlockedModel). The
// straggler loss of the step is N x (max_r own_r - median_r own_r): the time every rank spent
// waiting for the slowest beyond what a typical rank would have made it wait. It is attributed
// to the rank with the largest own time. During a hang every rank-second without progress is
// hang loss. The denominator is the rank-seconds the job ran: the sum of its ranks' step times
// (and N per second of hang).
//
// Kept over the step window (K steps) and since the job started; the totals are durable
// (ExportState / FromState), the window is rebuilt from the window's steps.
//
// Not thread-safe: owned by the job's pipeline.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

struct RankCost {
  uint32_t rank = 0;
  double window_rank_seconds = 0;
  double total_rank_seconds = 0;
};

struct LostTimeSummary {
  double window_rank_seconds = 0;  // N x step time over the window's steps
  double window_straggler_rank_seconds = 0;
  double total_rank_seconds = 0;  // since the job started
  double total_straggler_rank_seconds = 0;
  double total_hang_rank_seconds = 0;
  std::vector<RankCost> top;  // the ranks that cost most since start, at most 3
};

class LostTime {
 public:
  LostTime(uint32_t world_size, size_t window_steps);

  // Accounts one aligned step (the window's newest). `model` says how each rank's blocked time
  // is known; kNone (ranks independent) and kUnknown count no straggler loss. `ends_hang`: the
  // step spans a hang already counted as hang loss; it counts nothing more.
  void AddStep(const StepWindow::Step& step, const BlockedModel& model, bool ends_hang = false);
  // Rebuilds the window part from a step whose totals are already counted (after Restore).
  void AddWindowOnly(const StepWindow::Step& step, const BlockedModel& model);
  // `seconds` of a hang of `ranks` ranks.
  void AddHang(double seconds, uint32_t ranks);

  LostTimeSummary Summary() const;
  // The per-step median step time of the newest accounted step (0 before any).
  double last_median_step_seconds() const { return last_median_step_seconds_; }

  state::v1::LostTimeState ExportState() const;
  // Restores the totals; the window starts empty. A damaged state is DataLoss.
  absl::Status ImportState(const state::v1::LostTimeState& state);

 private:
  // Rank-nanoseconds: integer sums are exact, so a restored job counts exactly as one that
  // never stopped, whatever the order of additions.
  struct StepCost {
    uint32_t culprit = 0;
    int64_t straggler = 0;
    int64_t rank_ns = 0;
  };
  StepCost CostOf(const StepWindow::Step& step, const BlockedModel& model);
  void Push(const StepCost& c);

  const uint32_t world_size_;
  const size_t window_steps_;
  std::deque<StepCost> window_;
  int64_t window_rank_ns_ = 0, window_straggler_ = 0;
  std::vector<int64_t> window_by_rank_, total_by_rank_;
  int64_t total_rank_ns_ = 0, total_straggler_ = 0, total_hang_ = 0;
  double last_median_step_seconds_ = 0;
  std::vector<double> own_, step_;  // scratch
};

}  // namespace rankwatch
