// Stage 3 of the step-time diagnosis (operators/step_time_diagnosis.h): the straggler scores.
// For each signal (dataloader, compute, own time), the worst rank's excess over the median rank
// divided by the typical local work of a step (the burden), over the whole window and over the
// newest steps (fast onset), and whether it reaches the warning threshold.
//
// Pure functions; the results are plain values owned by the caller.
#pragma once

#include <algorithm>
#include <cstdint>

#include "operators/step_time/own_time.h"
#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"

namespace rankwatch::step_time {

// `value` reaches `threshold`, allowing for rounding: 10 ms of a 100 ms step is a share of
// 0.09999999999999999, and it is at the 0.10 threshold.
inline bool AtLeast(double value, double threshold) { return value >= threshold - 1e-9; }

// The rank with the largest excess (seconds per step) and that excess; rank 0 and 0 s when no
// rank has an excess above 0.
struct Excess {
  uint32_t rank = 0;
  double seconds = 0;
};
Excess Largest(const RankValues& excess);

// One signal's straggler score.
struct SignalScore {
  double full = 0;     // over the window (0 until the window holds enough steps)
  double onset = 0;    // over the newest steps, from the least excess in any of them
  Excess onset_worst;  // the rank with the largest consistent excess over the newest steps
  double score() const { return std::max(full, onset); }
};

// What stage 3 finds.
struct StragglerScores {
  // The typical local work per step, dataloader + compute of the median rank, so waiting does
  // not dilute a score; the median step time when no compute phase is reported.
  double burden = 0;
  double onset_burden = 0;          // the same over the newest steps
  OnsetSignals onset;               // NewestSteps(window, onset_steps, blocked)
  SignalScore input, compute, own;  // compute: 0 unless WindowSignals::ComputeConsistent
  bool input_hit = false, compute_hit = false, own_hit = false;  // score >= straggler_warn
  bool any_hit() const { return input_hit || compute_hit || own_hit; }
};

// Stage 3. Full-window scores count only once the window holds twice the onset steps (or is
// full): until then its means are no steadier than the newest steps. O(onset_steps x ranks).
StragglerScores ScoreStragglers(const StepWindow& window, const WindowSignals& signals,
                                const OwnTimeSignals& own_time,
                                const StepDiagnosisOptions& options);

}  // namespace rankwatch::step_time
