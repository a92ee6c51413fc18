// Stage 2 of the step-time diagnosis (operators/step_time_diagnosis.h): own time and the
// blocked model. Whether the ranks run synchronised, how the time a rank spent blocked waiting
// for other ranks is known (BlockedModel), and from it each rank's local compute, own time
// (step time less blocked time) and time outside every measured phase: over the window, from
// the means of stage 1 (signals.h), and over the newest steps, step by step (fast onset).
//
// Pure functions; the results are plain values owned by the caller. The public pieces of this
// stage (WindowMean, BlockedModelOf, OwnTime) are declared in step_time_diagnosis.h.
#pragma once

#include <array>
#include <cstdint>

#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"

namespace rankwatch::step_time {

// The part of a phase that absorbs waiting (backward; forward + backward when sharded) that is
// not a GC pause: GC pauses are the rank's own work, never waiting. `gc` is the rank's GC time
// (wherever it fell); at most half of the phase is taken out, since a longer pause must have
// fallen elsewhere at least in part (docs/diagnoses.md, "GC pauses").
double LessGc(double phase, double gc);

// Per-step local compute of one rank: forward + backward + optimizer (+ forward_backward) less
// the part of them the rank spent blocked on other ranks, as `model` says; NaN when the model
// leaves it unknown. `v` and `present` as for OwnTime.
double ComputeOf(const std::array<double, kPhaseCount>& v, uint32_t present,
                 const BlockedModel& model);

// A rank's outside time: own - dataloader - compute (each 0 when unknown), at least 0; NaN when
// `own` is unknown.
double OutsideOf(const std::array<double, kPhaseCount>& v, uint32_t present, double own,
                 double compute);

// The step-time skew of the window, (worst rank - median rank) / median rank of the per-rank
// mean step times, leaving out the window's oldest and newest steps (when it holds 4 or more):
// under synchronisation a rank's stall in the newest step makes the others wait in the next one,
// not yet in the window, and the wait for a stall just evicted still sits in the oldest step.
// O(ranks).
double InnerStepSkew(const StepWindow& window);

// What stage 2 finds over the window.
struct OwnTimeSignals {
  // Step-time skew across ranks at most StepDiagnosisOptions::sync_max_step_skew (two or more
  // ranks): the ranks run data parallel and wait for each other.
  bool synchronized = false;
  BlockedModel blocked;
  // Per rank, from its window means: ComputeOf (NaN when it reports no compute phase), OwnTime
  // and OutsideOf.
  RankValues compute, own, outside;
  // EvidenceOf each.
  SignalEvidence compute_evidence, own_evidence, outside_evidence;
};

// Stage 2 over the window, from stage 1's means. `sharded`: the job shards its parameters.
// O(ranks x phases).
OwnTimeSignals ModelOwnTime(const StepWindow& window, const WindowSignals& signals,
                            const StepDiagnosisOptions& options, bool sharded);

// Stage 2 over the newest `k` steps (fast onset): per rank, its consistent excess, the least,
// over those steps, by which its dataloader (compute, own) time exceeded that step's median
// rank; and the typical burden, the medians over those steps of each step's median rank
// (dataloader + compute). A rank that became slow exceeds the median in every step. Ranks that
// merely take turns being slow do not: under CPU contention a rank's per-step compute varies by
// +-50 %, so per-rank medians of 8 steps of equal ranks differ by 20 % while no rank is slower
// in all 8.
struct OnsetSignals {
  RankValues dl_excess, compute_excess, own_excess;  // NaN where the rank has no value
  double burden = 0;
};

// O(k x ranks). Above 4,096 ranks each step's median rank comes from an evenly strided sample
// of 2,048 ranks.
OnsetSignals NewestSteps(const StepWindow& window, uint32_t k, const BlockedModel& model);

}  // namespace rankwatch::step_time
