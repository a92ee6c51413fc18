// Stage 3b of the step-time diagnosis (operators/step_time_diagnosis.h): the statistical test of
// a rank's excess, and its pattern over the window's steps (docs/diagnoses.md, "Statistical
// detection" and "Patterns").
//
// The share scores of stage 3 (scores.h) name a rank once its excess reaches a fixed share of
// the step. This stage decides from the evidence instead: for one signal (dataloader, compute
// or own time), each step's reference is the median of a set of reference ranks in that step,
// and a rank's excess series is its value less that reference, step by step. The step-to-step
// noise of such series is measured on the reference ranks themselves (pooled, with batch means
// for autocorrelated noise), and a candidate's mean excess over the newest 16, 32, 64 or all
// steps is tested against it: significant when it is at least StepDiagnosisOptions::straggler_z
// standard errors and at least straggler_min_excess of the step's burden. A couple of stalls in
// the window (a checkpoint, one GC pass, a loaded host) are not a straggler: the stall steps are
// left out of the mean unless there are StepDiagnosisOptions::pattern_min_stalls regular ones or
// twice as many irregular ones.
//
// Then the culprit's series is described: its stalls (steps whose excess rises far above its
// own and its neighbours' baseline) and their period, a drift (a line from some step on fits the
// series better than one step change), and the step since which the excess holds, when the
// window shows it.
//
// Cost: O(steps x reference ranks) per signal (at most kReferenceRanks reference ranks) and
// O(steps) per tested rank; nothing is O(ranks x steps). Pure functions; results are plain
// values owned by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"

namespace rankwatch::step_time {

enum class TestSignal : uint8_t { kInput, kCompute, kOwn };

// A signal's value for one rank in one step (seconds), or NaN when unknown: the dataloader
// phase, local compute (ComputeOf) or own time (OwnTime with the rank's GC).
double SignalValue(const StepWindow::Entry& e, TestSignal signal, const BlockedModel& model);

// At most this many reference ranks per signal (evenly strided over the world).
inline constexpr uint32_t kReferenceRanks = 64;

// The per-step references of one signal over the window, and the noise of a typical rank's
// excess series.
struct SignalReference {
  bool present = false;         // at least 2 reference ranks in enough steps
  std::vector<uint64_t> steps;  // the window's step numbers, oldest first
  std::vector<double> value;    // per step: the median reference rank; NaN when unknown
  double noise_var = 0;         // pooled per-step variance of a rank's excess, seconds^2
  double noise_lrv = 0;         // pooled long-run variance (batch means), seconds^2 a step
  uint32_t reference_ranks = 0;
};

SignalReference ReferenceOf(const StepWindow& window, TestSignal signal, const BlockedModel& model);
// ReferenceOf in two parts: the per-step references only (steps, value, reference_ranks;
// present stays false), enough for SeriesOf; then the noise, which makes it whole.
SignalReference ReferenceValuesOf(const StepWindow& window, TestSignal signal,
                                  const BlockedModel& model);
void MeasureNoise(const StepWindow& window, TestSignal signal, const BlockedModel& model,
                  SignalReference* reference);

// One rank's excess series over the window: its value less the step's reference, for each step
// where both are known.
struct ExcessSeries {
  std::vector<uint64_t> steps;
  std::vector<double> excess;
};
ExcessSeries SeriesOf(const StepWindow& window, TestSignal signal, const BlockedModel& model,
                      const SignalReference& reference, uint32_t rank);
// The series of several ranks in one pass over the window (each as SeriesOf gives it).
std::vector<ExcessSeries> SeriesOf(const StepWindow& window, TestSignal signal,
                                   const BlockedModel& model, const SignalReference& reference,
                                   const std::vector<uint32_t>& ranks);

// The test of one rank's series.
struct ExcessTestResult {
  bool present = false;      // the series and the noise are known
  bool significant = false;  // z >= straggler_z and excess >= straggler_min_excess x burden
  uint32_t rank = 0;
  double excess = 0;  // mean excess over the steps tested (stall steps left out when few)
  double noise = 0;   // its standard error
  double z = 0;
  uint32_t steps = 0;  // the newest steps tested (the length with the largest z)
};

ExcessTestResult TestExcess(const ExcessSeries& series, const SignalReference& reference,
                            double burden, const StepDiagnosisOptions& options, uint32_t rank);

// Whether TestExcess cannot find `series` significant, whatever the reference's noise: it is
// too short, or it has no stall step (its spread is under pattern_stall_share of the burden, the
// least stall threshold) and its mean over every length TestExcess tries is under
// straggler_min_excess of the burden. Computed as TestExcess computes those means, so the answer
// is exact; O(steps). Most ranks of most windows pass it, which spares their full test and the
// reference's noise.
bool CannotBeSignificant(const ExcessSeries& series, double burden,
                         const StepDiagnosisOptions& options);

// The culprit's series described (StragglerTest's pattern fields).
struct ExcessPattern {
  StragglerPattern pattern = StragglerPattern::kSteady;
  // Where the pattern began: the first stall, the start of the drift, the step change; else the
  // window's first step, with onset_in_window false (it held for the whole window or longer).
  uint64_t since_step = 0;
  bool onset_in_window = false;
  double period_steps = 0;
  double stall_seconds = 0;
  uint32_t stalls = 0;
  double drift_seconds_per_step = 0;
};

ExcessPattern DescribeExcess(const ExcessSeries& series, const SignalReference& reference,
                             double burden, const StepDiagnosisOptions& options);

}  // namespace rankwatch::step_time
