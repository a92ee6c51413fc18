// Stage 1 of the step-time diagnosis (operators/step_time_diagnosis.h): the signals of a
// window. Each rank's per-step mean of every phase over the window, the cross-rank evidence of
// each phase (median, worst rank, top offenders), the same for GC pauses, and the phases the
// diagnosis needs that some ranks do not report. Nothing here knows which time is blocked waiting:
// that is stage 2 (own_time.h).
//
// Pure functions of the window; the results are plain values owned by the caller.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"

namespace rankwatch::step_time {

// One value per rank (seconds per step); NaN where the rank has none.
using RankValues = std::vector<double>;

inline bool Known(double v) { return !std::isnan(v); }
constexpr int PhaseIndex(Phase p) { return static_cast<int>(p); }
constexpr uint32_t PhaseBit(Phase p) { return 1u << PhaseIndex(p); }
// The phases whose sum is a rank's compute (before the blocked time is taken out).
constexpr uint32_t kComputeMask = PhaseBit(Phase::kForward) | PhaseBit(Phase::kBackward) |
                                  PhaseBit(Phase::kOptimizer) | PhaseBit(Phase::kForwardBackward);

// Cross-rank statistics of one per-rank signal: the ranks that have a value, their median, the
// worst (largest) value and its rank (the lowest rank on a tie), the skew, and the top 3 ranks
// above the median, largest excess first. Not present when no rank has a value.
SignalEvidence EvidenceOf(const RankValues& values);

// What stage 1 finds in a window.
struct WindowSignals {
  // phase[p][r]: rank r's per-step mean of phase p over the window (WindowMean); NaN where r
  // never reported p.
  std::array<RankValues, kPhaseCount> phase;
  // present[r]: the bits (PhaseBit) of the phases rank r reported in the window.
  std::vector<uint32_t> present;
  // evidence[p] = EvidenceOf(phase[p]).
  std::array<SignalEvidence, kPhaseCount> evidence;
  // The phases the diagnosis needs that some ranks do not report (MissingSignals).
  std::vector<MissingSignal> missing;
  // gc[r]: rank r's GC pause time per step over the window (WindowGcMean), gc_collections[r]
  // its collections per step; NaN where r never reported GC. gc_evidence = EvidenceOf(gc).
  RankValues gc, gc_collections;
  SignalEvidence gc_evidence;
  double gc_median_collections = 0;  // over the ranks reporting GC; 0 when none does

  const PhaseStat& step() const { return evidence[PhaseIndex(Phase::kStep)].stat; }
  // The median rank's per-step mean of `p`; 0 when no rank reports it.
  double Median(Phase p) const {
    const PhaseStat& s = evidence[PhaseIndex(p)].stat;
    return s.present ? s.median_seconds : 0.0;
  }
  // Whether some ranks of the window do not report `p` (`missing` names it).
  bool IsMissing(Phase p) const;
  // Each compute phase is reported by every rank of the window or by none, so per-rank compute
  // totals are comparable.
  bool ComputeConsistent() const;
};

// Stage 1. O(ranks x phases); reads the window's running totals, not its steps.
WindowSignals MeasureWindow(const StepWindow& window);

// The phases some ranks of the window do not report, among those the diagnosis needs
// (dataloader, forward, backward, optimizer; forward and backward are covered by
// forward_backward), preceded by Phase::kStep when some ranks are silent for the whole window.
// Each lists at most 16 of the ranks that do not report it, lowest first.
std::vector<MissingSignal> MissingSignals(const StepWindow& window);

}  // namespace rankwatch::step_time
